#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""drafter_loop.py - a small PyTorch training loop fed by hsflow.Consumer.

The "drafter" is a stand-in: one linear layer from the k captured hidden
states of a token ([k*H], bf16) to the vocabulary, trained with cross-entropy
to predict the next input id of the same sequence (where the loss mask is
set). What matters here is the data path: the loop prints tokens/s and how
long it waited for data (trainer starve).

Consumer only (producers started elsewhere, e.g. on the target nodes):

    python examples/drafter_loop.py --listen 0.0.0.0:7000 --cache-gb 64 --epochs 2 --gpu 0
    hs-producer --to drafter:7000 --data train.hst --token-budget 65536 \\
        --hidden-size 4096 --layers 2,16,29 --source model --model /models/llama --gpus 0,1,2

Everything on one machine, with N local hs-producer processes getting the
arguments after `--`:

    hs-data synth /tmp/demo.jsonl --sequences 2000 --max-len 2048 --vocab 512
    python examples/drafter_loop.py --device cpu --vocab 512 --loopback 2 -- \\
        --data /tmp/demo.jsonl --token-budget 8192 --hidden-size 256 --layers 2,16,29 \\
        --source synthetic --gpus cpu:1
"""
import argparse
import sys
import time

import _support  # examples/_support.py, next to this script: finds hsflow in a checkout
import hsflow


def parse_args(argv):
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        description="Train a linear+cross-entropy drafter stand-in on hidden states streamed "
                    "by hsflow; prints tokens/s and the time spent waiting for data.",
        epilog="With --loopback N, the arguments after `--` go to each of N local hs-producer "
               "processes (found next to libhsflow, via $HSFLOW_BIN_DIR, or on PATH), which "
               "get --to 127.0.0.1:PORT added.",
        usage="%(prog)s [options] [-- hs-producer options]")
    ap.add_argument("--listen", default="127.0.0.1:7000",
                    help="HOST:PORT to listen on (default 127.0.0.1:7000; with --loopback a "
                         "free port on 127.0.0.1)")
    ap.add_argument("--cache-gb", type=float, default=4.0, help="host-RAM cache in GiB (4)")
    ap.add_argument("--epochs", type=int, default=1, help="epochs to train (1)")
    ap.add_argument("--gpu", default="none",
                    help="GPU the consumer delivers batches to, or 'none' for host delivery "
                         "(default none)")
    ap.add_argument("--device", default=None,
                    help="where the drafter trains: cpu, cuda, cuda:N (default: cuda:GPU with "
                         "--gpu, else cuda if available, else cpu)")
    ap.add_argument("--vocab", type=int, default=32000,
                    help="vocabulary size of the drafter's head (32000); larger ids are "
                         "taken modulo it")
    ap.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (0.05)")
    ap.add_argument("--max-batches", type=int, default=0,
                    help="stop after this many batches (default 0: the whole run)")
    ap.add_argument("--log-every", type=int, default=10, help="print every N batches (10)")
    ap.add_argument("--verify-synthetic", action="store_true",
                    help="the consumer checks every value against the synthetic source")
    ap.add_argument("--secret-file", default=None, help="shared secret for the handshake")
    ap.add_argument("--transport", default="auto", choices=["auto", "shm", "tcp", "ucx"])
    ap.add_argument("--loopback", type=int, default=0, metavar="N",
                    help="start N local hs-producer processes with the arguments after --")
    args = _support.parse_args(ap, argv, " (at least --data, --token-budget, --hidden-size, "
                                         "--layers)")
    args.gpu = None if args.gpu.lower() in ("none", "-1") else int(args.gpu)
    return args


def start_producers(n, port, producer_args):
    exe = hsflow.find_tool("hs-producer")
    if not exe:
        sys.exit("drafter_loop: hs-producer not found next to %s, in $HSFLOW_BIN_DIR or on "
                 "PATH; build it (cmake --build build --target hs-producer)"
                 % hsflow.library_path())
    return _support.start_producers("drafter_loop", exe, n, "127.0.0.1:%d" % port,
                                     producer_args)


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        sys.exit('drafter_loop: needs PyTorch: pip install "hsflow[torch]" (CPU-only: '
                 "pip install torch --index-url https://download.pytorch.org/whl/cpu)")

    if args.device is None:
        if args.gpu is not None:
            args.device = "cuda:%d" % args.gpu
        else:
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    torch.manual_seed(0)

    listen = "127.0.0.1:0" if args.loopback else args.listen
    consumer = hsflow.Consumer(listen=listen, gpu=args.gpu, cache_gb=args.cache_gb,
                               epochs=args.epochs, verify_synthetic=args.verify_synthetic,
                               secret_file=args.secret_file, transport=args.transport,
                               arrays="torch")
    procs = start_producers(args.loopback, consumer.port, args.producer_args) \
        if args.loopback else []
    print("drafter_loop: consumer on port %d, training on %s" % (consumer.port, device),
          flush=True)

    model = None
    batches = tokens = trained = 0
    waited = 0.0
    loss_v = float("nan")
    t_first = None
    rc = 0
    try:
        while not args.max_batches or batches < args.max_batches:
            tw = time.perf_counter()
            try:
                b = consumer.next_batch(timeout=1.0)
            except StopIteration:
                break
            if b is None:  # nothing yet: make sure someone is still producing
                if procs and all(p.poll() is not None for p in procs):
                    print("drafter_loop: every hs-producer exited and batches are missing",
                          file=sys.stderr)
                    rc = 1
                    break
                if batches:
                    waited += time.perf_counter() - tw
                continue
            if batches:  # before the first batch the wait is start-up, not starve
                waited += time.perf_counter() - tw
            else:
                t_first = time.perf_counter()
            kH = b.n_layers * b.hidden_size
            if model is None:
                model = torch.nn.Linear(kH, args.vocab, device=device)
                print("drafter_loop: drafter Linear(%d -> %d), layers %s, H=%d"
                      % (kH, args.vocab, list(b.layers), b.hidden_size), flush=True)

            # Everything the step needs is copied/computed here, before the
            # next batch is taken (which gives this batch's memory back).
            hs = b.hidden_states.to(device)          # [T, k*H] bf16
            ids = b.input_ids.to(device).long()      # [T]
            mask = b.loss_mask.to(device).bool()     # [T]
            cu = b.cu_seqlens.to(device).long()      # [n+1]
            T = b.n_tokens
            # Predict ids[t+1] from the states of token t, inside one sequence.
            valid = torch.ones(T, dtype=torch.bool, device=device)
            valid[cu[1:] - 1] = False
            valid &= torch.roll(mask, -1)
            target = torch.roll(ids, -1) % args.vocab
            x = hs[valid]
            if on_gpu:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(x)
            else:
                logits = model(x.float())
            loss = F.cross_entropy(logits.float(), target[valid])
            model.zero_grad(set_to_none=True)
            loss.backward()
            with torch.no_grad():  # plain SGD: the drafter is only a stand-in
                for p in model.parameters():
                    p.add_(p.grad, alpha=-args.lr)

            batches += 1
            tokens += T
            trained += int(x.shape[0])
            if batches % args.log_every == 0:
                loss_v = loss.item()  # also waits for the GPU: the figures are honest
                el = time.perf_counter() - t_first
                print("batch %5d | epoch %d | loss %.4f | %.0f tokens/s | waited for data "
                      "%.2f s (%.1f%%)" % (batches, b.epoch, loss_v, tokens / el, waited,
                                           100 * waited / el), flush=True)
        if batches:
            loss_v = loss.item()
        if on_gpu:
            torch.cuda.synchronize(device)
    except KeyboardInterrupt:
        rc = 130
    finally:
        t_end = time.perf_counter()
        s = consumer.stats()
        consumer.close()  # tells producers BYE
        _support.stop_producers(procs, 30)

    el = (t_end - t_first) if t_first else 0.0
    print("drafter_loop: %d batches, %d tokens (%d trained) in %.2f s: %.0f tokens/s, waited "
          "for data %.2f s (%.1f%%), final loss %.4f; consumer: %d/%d batches, starve %.1f%%, "
          "%d checksum failures"
          % (batches, tokens, trained, el, tokens / el if el > 0 else 0.0, waited,
             100 * waited / el if el > 0 else 0.0, loss_v, s["batches_delivered"],
             s["batches_planned"], s["starve_pct"], s["checksum_failures"]), flush=True)
    if not rc and not args.max_batches and s["batches_planned"] and \
            s["batches_delivered"] != s["batches_planned"]:
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
