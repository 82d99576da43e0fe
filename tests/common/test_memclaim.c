/* SPDX-License-Identifier: Apache-2.0 */
/* test_memclaim.c - the node's registry of cache claims cannot be steered
 * by what is put in it: it is this user's own folder (0700, owner checked;
 * another user can neither lock it nor plant in it), a link or FIFO as its
 * lock is neither followed nor waited on, a held lock delays a start by at
 * most 5 s, a forged claim is bounded and its text printed sanitised, and
 * no number of junk entries hides a real claim. Each case runs on a
 * stand-in system (hsflow_set_system_root) of its own. */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hsflow.h"
#include "hs_time.h"
#include "hs_memclaim.h"

#define NOBODY 65534

static char g_root[512], g_dir[700];

/* A stand-in system at g_root; g_dir is where its registry must be. */
static void fake_system(void)
{
    /* tmpfs where there is one: thousands of files are made in it at once */
    struct stat shm;
    const char *tmp = getenv("TMPDIR")                                      ? getenv("TMPDIR")
                      : stat("/dev/shm", &shm) == 0 && S_ISDIR(shm.st_mode) ? "/dev/shm"
                                                                            : "/tmp";
    snprintf(g_root, sizeof g_root, "%s/hs-memclaim.XXXXXX", tmp);
    ck_assert_ptr_nonnull(mkdtemp(g_root));
    ck_assert_int_eq(chmod(g_root, 0755), 0);
    hsflow_set_system_root(g_root);
    hs_mem_claim_registry_set(NULL);
    snprintf(g_dir, sizeof g_dir, "%s/dev/shm/hsflow-cache-%u", g_root, (unsigned)geteuid());
}

static void fake_system_end(void)
{
    hsflow_set_system_root(NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    ck_assert_int_eq(system(cmd), 0);
}

/* Opens the registry, checks how long that took, and returns it. */
static hs_mem_claim_t *probe(double max_s)
{
    hs_mem_claim_t *m = NULL;
    double t0 = hs_now_s();
    ck_assert_int_eq(hs_mem_claim_open(&m), HS_OK);
    double took = hs_now_s() - t0;
    ck_assert_msg(took < max_s, "opening the registry took %.1f s", took);
    return m;
}

/* Makes the registry (a claim opened and released). */
static void registry_make(void)
{
    hs_mem_claim_t *m = probe(10);
    ck_assert_str_eq(hs_mem_claim_dir(m), g_dir);
    hs_mem_claim_release(m);
}

START_TEST(the_registry_is_a_folder_of_this_users_own_closed_to_others)
{
    fake_system();
    registry_make();
    struct stat st;
    ck_assert_int_eq(lstat(g_dir, &st), 0);
    ck_assert(S_ISDIR(st.st_mode));
    ck_assert_uint_eq(st.st_uid, geteuid());
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
    /* one of this user's that was left open to others is closed */
    ck_assert_int_eq(chmod(g_dir, 0777), 0);
    registry_make();
    ck_assert_int_eq(lstat(g_dir, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
    /* a link in its place is not followed */
    char elsewhere[600];
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere", g_root);
    ck_assert_int_eq(mkdir(elsewhere, 0700), 0);
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && ln -s '%s' '%s'", g_dir, elsewhere, g_dir);
    ck_assert_int_eq(system(cmd), 0);
    hs_mem_claim_t *m = probe(10);
    ck_assert_str_eq(hs_mem_claim_dir(m), "");
    ck_assert_int_eq(hs_mem_claim_commit(m, 1u << 20, "linked"), HS_OK);
    hs_mem_claim_release(m);
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", elsewhere);
    ck_assert_msg(system(cmd) == 0, "a file was made through the link");
    fake_system_end();
}
END_TEST

/* Root only: a folder of another user in the registry's place is not used,
 * and another user can neither lock nor plant in this user's registry. */
START_TEST(another_user_can_neither_lock_the_registry_nor_plant_in_it)
{
    if (geteuid() != 0) {
        fprintf(stderr, "another_user_...: skipped, needs root to act as another user\n");
        return;
    }
    fake_system();
    registry_make();
    /* as nobody: no lock to take, no claim to plant */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0) _exit(3);
        char path[800];
        snprintf(path, sizeof path, "%s/.lock", g_dir);
        int fd = open(path, O_RDONLY | O_CREAT, 0644);
        if (fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) == 0) _exit(1);
        snprintf(path, sizeof path, "%s/1.0.claim", g_dir);
        if (open(path, O_WRONLY | O_CREAT, 0644) >= 0) _exit(2);
        _exit(0);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "another user %s the registry (child status %d)",
                  WEXITSTATUS(status) == 1 ? "locked" : "planted a claim in", status);
    /* a folder another user made in its place: not used, nothing made in it */
    char cmd[900];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(mkdir(g_dir, 0777), 0);
    ck_assert_int_eq(chown(g_dir, NOBODY, NOBODY), 0);
    ck_assert_int_eq(chmod(g_dir, 0777), 0);
    hs_mem_claim_t *m = probe(10);
    ck_assert_str_eq(hs_mem_claim_dir(m), "");
    ck_assert_int_eq(hs_mem_claim_commit(m, 1u << 20, "refused"), HS_OK);
    hs_mem_claim_release(m);
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", g_dir);
    ck_assert_msg(system(cmd) == 0, "a file was made in another user's folder");
    fake_system_end();
}
END_TEST

START_TEST(a_linked_or_fifo_lock_is_neither_followed_nor_waited_on)
{
    fake_system();
    registry_make();
    char lock[800], victim[700];
    snprintf(lock, sizeof lock, "%s/.lock", g_dir);
    snprintf(victim, sizeof victim, "%s/victim", g_root);
    ck_assert_int_eq(unlink(lock), 0);
    ck_assert_int_eq(symlink(victim, lock), 0);
    hs_mem_claim_t *m = probe(10);
    ck_assert_msg(access(victim, F_OK) != 0, "a file was made where the link points");
    ck_assert_str_eq(hs_mem_claim_dir(m), "");
    hs_mem_claim_release(m);
    ck_assert_int_eq(unlink(lock), 0);
    ck_assert_int_eq(mkfifo(lock, 0600), 0);
    m = probe(10); /* the case's timeout fails a wait for a writer */
    ck_assert_str_eq(hs_mem_claim_dir(m), "");
    hs_mem_claim_release(m);
    fake_system_end();
}
END_TEST

START_TEST(a_held_lock_delays_a_start_by_at_most_5_s)
{
    fake_system();
    registry_make();
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) { /* holds the lock, as a hung consumer between open and commit */
        hs_mem_claim_t *held;
        if (hs_mem_claim_open(&held) != HS_OK || !hs_mem_claim_dir(held)[0]) _exit(1);
        (void)!write(ready[1], "x", 1);
        sleep(60);
        _exit(0);
    }
    char x;
    ck_assert_int_eq(read(ready[0], &x, 1), 1);
    double t0 = hs_now_s();
    hs_mem_claim_t *m = probe(15);
    double took = hs_now_s() - t0;
    ck_assert_msg(took >= 4.5, "gave up on the lock after %.1f s", took);
    ck_assert_str_eq(hs_mem_claim_dir(m), ""); /* not used: nothing read or removed */
    hs_mem_claim_release(m);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(ready[0]);
    close(ready[1]);
    /* its holder gone, the registry is used again at once */
    m = probe(2);
    ck_assert_str_eq(hs_mem_claim_dir(m), g_dir);
    hs_mem_claim_release(m);
    fake_system_end();
}
END_TEST

/* A claim file named for this process (so it looks live while fd holds it
 * locked); returns that fd. */
static int plant_claim(unsigned n, const char *text)
{
    char path[900];
    snprintf(path, sizeof path, "%s/%d.%u.claim", g_dir, (int)getpid(), n);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    ck_assert_int_eq(flock(fd, LOCK_EX), 0);
    return fd;
}

START_TEST(a_forged_claim_is_bounded_and_its_text_sanitised)
{
    fake_system();
    registry_make();
    const uint64_t MiB = 1ull << 20;
    char text[300];
    snprintf(text, sizeof text, "pid %d\nbytes 18446744073709551615\nwho \x1b[31mall of it\n",
             (int)getpid());
    int forged = plant_claim(900, text);
    hs_mem_claim_t *m = probe(10);
    unsigned n;
    (void)hs_mem_claim_others_text(m, &n);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(hs_mem_claim_others(m), 0);
    ck_assert_uint_eq(hs_mem_claim_skipped(m), 1);
    hs_mem_claim_release(m);
    /* a claim of a plausible size is counted, its text printable */
    snprintf(text, sizeof text, "pid %d\nbytes %llu\nwho \x1b[2Jrank 1\x07 \xff\n", (int)getpid(),
             (unsigned long long)(200 * MiB));
    int fair = plant_claim(901, text);
    m = probe(10);
    const char *said = hs_mem_claim_others_text(m, &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(hs_mem_claim_others(m), 200 * MiB);
    ck_assert_msg(strstr(said, "?[2Jrank 1? ? (pid"), "the claim is described as '%s'", said);
    for (const char *p = said; *p; p++)
        ck_assert_msg(*p >= 0x20 && *p < 0x7f, "byte 0x%02x in '%s'", (unsigned char)*p, said);
    hs_mem_claim_release(m);
    close(forged);
    close(fair);
    fake_system_end();
}
END_TEST

/* n files named like claims but not ones (junk-<i>.claim) in the registry. */
static void plant_junk(unsigned from, unsigned n)
{
    char path[900];
    for (unsigned i = from; i < from + n; i++) {
        snprintf(path, sizeof path, "%s/junk-%u.claim", g_dir, i);
        int fd = open(path, O_WRONLY | O_CREAT, 0600);
        ck_assert_int_ge(fd, 0);
        close(fd);
    }
}

START_TEST(no_number_of_junk_entries_hides_a_claim)
{
    fake_system();
    registry_make();
    enum { REAL = 8, JUNK = 5000 }; /* the claims lie past the first 4,096 entries */
    const uint64_t GiB = 1ull << 30;
    hs_mem_claim_t *claims[REAL];
    plant_junk(0, JUNK);
    for (unsigned i = 0; i < REAL; i++) {
        claims[i] = probe(30);
        ck_assert_int_eq(hs_mem_claim_commit(claims[i], GiB, "rank"), HS_OK);
    }
    plant_junk(JUNK, JUNK);
    hs_mem_claim_t *m = probe(30);
    unsigned n;
    (void)hs_mem_claim_others_text(m, &n);
    ck_assert_uint_eq(n, REAL);
    ck_assert_uint_eq(hs_mem_claim_others(m), REAL * GiB);
    ck_assert_uint_eq(hs_mem_claim_skipped(m), 2 * JUNK);
    hs_mem_claim_release(m);
    for (unsigned i = 0; i < REAL; i++)
        hs_mem_claim_release(claims[i]);
    fake_system_end();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("memclaim");
    TCase *tc = tcase_create("registry");
    tcase_set_timeout(tc, 30); /* a lock or FIFO waited on fails here */
    tcase_add_test(tc, the_registry_is_a_folder_of_this_users_own_closed_to_others);
    tcase_add_test(tc, another_user_can_neither_lock_the_registry_nor_plant_in_it);
    tcase_add_test(tc, a_linked_or_fifo_lock_is_neither_followed_nor_waited_on);
    tcase_add_test(tc, a_held_lock_delays_a_start_by_at_most_5_s);
    tcase_add_test(tc, a_forged_claim_is_bounded_and_its_text_sanitised);
    tcase_add_test(tc, no_number_of_junk_entries_hides_a_claim);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
