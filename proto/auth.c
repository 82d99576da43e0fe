/* SPDX-License-Identifier: Apache-2.0 */
/* auth.c - shared-secret challenge/response between producer and consumer
 * (libsodium: BLAKE2b for the key, HMAC-SHA256 for the proofs, constant-time
 * comparison). The protocol is described in hs_proto.h. */
#include "hs_proto.h"
#include "hs_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SECRET_MIN 16u
#define SECRET_MAX 4096u

static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;
static int sodium_status = -1;

static void sodium_init_once(void) { sodium_status = sodium_init() < 0 ? -1 : 0; }

hs_status_t hs_auth_init(void)
{
    pthread_once(&sodium_once, sodium_init_once);
    if (sodium_status != 0) {
        hs_error("libsodium failed to initialise: authentication is unavailable");
        return HS_ERR_UNSUPPORTED;
    }
    return HS_OK;
}

hs_status_t hs_auth_load_secret(const char *path, hs_auth_key_t *key)
{
    hs_status_t st = hs_auth_init();
    if (st != HS_OK) return st;
    uint8_t buf[SECRET_MAX + 1];
    size_t len = 0;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
     * writer, deaf to every signal the binaries handle; it changes nothing
     * for the regular file that is read below. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        hs_error("cannot open secret file '%s': %m; create it with at least %u bytes of random "
                 "text (e.g. head -c 32 /dev/urandom | base64 > '%s'; chmod 600 '%s')",
                 path, SECRET_MIN, path, path);
        return HS_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        hs_error("cannot stat secret file '%s': %m", path);
        st = HS_ERR_IO;
        goto err_close;
    }
    if (!S_ISREG(sb.st_mode)) {
        hs_error("secret file '%s' is %s, not a regular file: give the path of a file that holds "
                 "the secret",
                 path,
                 S_ISFIFO(sb.st_mode)                         ? "a FIFO"
                 : S_ISDIR(sb.st_mode)                        ? "a directory"
                 : S_ISSOCK(sb.st_mode)                       ? "a socket"
                 : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
                                                              : "not a file");
        st = HS_ERR_INVALID;
        goto err_close;
    }
    if (sb.st_mode & (S_IRWXG | S_IRWXO))
        hs_warn("secret file '%s' is accessible by group or others (mode %03o): chmod 600 it", path,
                (unsigned)(sb.st_mode & 0777));
    for (;;) {
        ssize_t r = read(fd, buf + len, sizeof buf - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            hs_error("cannot read secret file '%s': %m", path);
            st = HS_ERR_IO;
            goto err_wipe;
        }
        if (r == 0) break;
        len += (size_t)r;
        if (len == sizeof buf) {
            hs_error("secret file '%s' is larger than %u bytes: is it the right file?", path,
                     SECRET_MAX);
            st = HS_ERR_INVALID;
            goto err_wipe;
        }
    }
    if (len > 0 && buf[len - 1] == '\n') len--;
    if (len > 0 && buf[len - 1] == '\r') len--;
    if (len < SECRET_MIN) {
        hs_error("secret file '%s' holds %zu bytes, at least %u are needed: write a longer random "
                 "secret into it (e.g. head -c 32 /dev/urandom | base64)",
                 path, len, SECRET_MIN);
        st = HS_ERR_INVALID;
        goto err_wipe;
    }
    crypto_generichash(key->bytes, sizeof key->bytes, buf, len, NULL, 0);
    sodium_memzero(buf, sizeof buf);
    close(fd);
    return HS_OK;

err_wipe:
    sodium_memzero(buf, sizeof buf);
err_close:
    close(fd);
    return st;
}

void hs_auth_key_clear(hs_auth_key_t *key)
{
    if (key) sodium_memzero(key->bytes, sizeof key->bytes);
}

hs_status_t hs_auth_nonce(uint8_t out[HS_AUTH_NONCE_BYTES])
{
    hs_status_t st = hs_auth_init();
    if (st != HS_OK) return st;
    randombytes_buf(out, HS_AUTH_NONCE_BYTES);
    return HS_OK;
}

hs_status_t hs_auth_producer_mac(const hs_auth_key_t *key,
                                 const uint8_t server_nonce[HS_AUTH_NONCE_BYTES],
                                 const uint8_t client_nonce[HS_AUTH_NONCE_BYTES],
                                 const void *hello_body, size_t hello_len,
                                 uint8_t mac[HS_AUTH_MAC_BYTES])
{
    static const char label[] = "hsflow-producer";
    hs_status_t st = hs_auth_init();
    if (st != HS_OK) return st;
    uint8_t hello_hash[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(hello_hash, hello_body, hello_len);
    crypto_auth_hmacsha256_state s;
    crypto_auth_hmacsha256_init(&s, key->bytes, sizeof key->bytes);
    crypto_auth_hmacsha256_update(&s, (const uint8_t *)label, sizeof label - 1);
    crypto_auth_hmacsha256_update(&s, server_nonce, HS_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&s, client_nonce, HS_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&s, hello_hash, sizeof hello_hash);
    crypto_auth_hmacsha256_final(&s, mac);
    sodium_memzero(&s, sizeof s);
    return HS_OK;
}

hs_status_t hs_auth_consumer_mac(const hs_auth_key_t *key,
                                 const uint8_t client_nonce[HS_AUTH_NONCE_BYTES],
                                 const uint8_t server_nonce[HS_AUTH_NONCE_BYTES],
                                 uint8_t mac[HS_AUTH_MAC_BYTES])
{
    static const char label[] = "hsflow-consumer";
    hs_status_t st = hs_auth_init();
    if (st != HS_OK) return st;
    crypto_auth_hmacsha256_state s;
    crypto_auth_hmacsha256_init(&s, key->bytes, sizeof key->bytes);
    crypto_auth_hmacsha256_update(&s, (const uint8_t *)label, sizeof label - 1);
    crypto_auth_hmacsha256_update(&s, client_nonce, HS_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&s, server_nonce, HS_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_final(&s, mac);
    sodium_memzero(&s, sizeof s);
    return HS_OK;
}

hs_status_t hs_auth_verify(const uint8_t a[HS_AUTH_MAC_BYTES], const uint8_t b[HS_AUTH_MAC_BYTES])
{
    return sodium_memcmp(a, b, HS_AUTH_MAC_BYTES) == 0 ? HS_OK : HS_ERR_AUTH;
}
