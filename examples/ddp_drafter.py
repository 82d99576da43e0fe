#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ddp_drafter.py - a data-parallel drafter fed by one hsflow consumer per rank.

Run under torchrun: each rank builds hsflow.Consumer(rank=RANK,
world=WORLD_SIZE), listening on --base-port + LOCAL_RANK (so every drafter
node's ranks are NODE:BASE-BASE+GPUS-1), and trains the stand-in
drafter of drafter_loop.py (one linear layer from the k captured hidden
states to the vocabulary, next-token cross-entropy) wrapped in
DistributedDataParallel: gloo on CPU, NCCL on GPUs. Every rank gets the same
number of batches per epoch (DESIGN §11), so the gradient all-reduce never
waits for a rank that ran out of data. Each rank prints its tokens/s and
how long it waited for data.

Drafter node with 4 GPUs, producers on the target nodes pointed at every rank:

    torchrun --nproc_per_node 4 examples/ddp_drafter.py --listen-host 0.0.0.0 \\
        --base-port 7000 --cache-gb 48 --epochs 2 --gpu-per-rank
    hs-producer --to drafter:7000-7003 --data train.hst --token-budget 65536 \\
        --model /models/target --dflash-layers 5 --gpus 0,1,2,3

One box, 2 ranks on the CPU, rank 0 starting N local hs-producer processes
(the arguments after `--`) that feed both ranks:

    hs-data synth /tmp/demo.jsonl --sequences 400 --max-len 1024 --vocab 512
    torchrun --standalone --nproc_per_node 2 examples/ddp_drafter.py --vocab 512 \\
        --base-port 7100 --loopback 2 -- --data /tmp/demo.jsonl --token-budget 4096 \\
        --hidden-size 64 --layers 2,16 --source synthetic --gpus cpu:1
"""
import argparse
import os
import sys
import time

import _support  # examples/_support.py, next to this script: finds hsflow in a checkout
import hsflow


def parse_args(argv):
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        description="Data-parallel (torchrun) drafter stand-in fed by one hsflow consumer per "
                    "rank; prints per-rank tokens/s and the time spent waiting for data.",
        usage="torchrun --nproc_per_node W %(prog)s [options] [-- hs-producer options]")
    ap.add_argument("--listen-host", default="127.0.0.1",
                    help="host each rank's consumer listens on (127.0.0.1)")
    ap.add_argument("--base-port", type=int, default=7000,
                    help="each rank listens on BASE_PORT + LOCAL_RANK of its node (7000)")
    ap.add_argument("--cache-gb", type=float, default=1.0, help="cache per rank, GiB (1)")
    ap.add_argument("--epochs", type=int, default=1, help="epochs to train (1)")
    ap.add_argument("--uneven", default="drop", choices=["drop", "repeat"],
                    help="leftover batches of an epoch: drop (default) or repeat")
    ap.add_argument("--gpu-per-rank", action="store_true",
                    help="deliver to and train on GPU LOCAL_RANK, with NCCL (default: CPU, gloo)")
    ap.add_argument("--vocab", type=int, default=32000, help="drafter vocabulary (32000)")
    ap.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (0.05)")
    ap.add_argument("--verify-synthetic", action="store_true",
                    help="the consumers check every value against the synthetic source")
    ap.add_argument("--loopback", type=int, default=0, metavar="N",
                    help="rank 0 starts N local hs-producer processes (arguments after --) "
                         "pointed at every rank")
    return _support.parse_args(ap, argv)


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
    except ImportError:
        sys.exit("ddp_drafter: needs PyTorch (pip install torch)")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        sys.exit("ddp_drafter: run it under torchrun (RANK and WORLD_SIZE are not set)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    gpu = local if args.gpu_per_rank else None
    device = torch.device("cuda:%d" % local if gpu is not None else "cpu")
    dist.init_process_group("nccl" if gpu is not None else "gloo")

    # rank and world come from torchrun's RANK / WORLD_SIZE
    consumer = hsflow.Consumer(listen="%s:%d" % (args.listen_host, args.base_port + local),
                               gpu=gpu, cache_gb=args.cache_gb, epochs=args.epochs,
                               uneven=args.uneven, verify_synthetic=args.verify_synthetic,
                               arrays="torch")
    procs = []
    if args.loopback and rank == 0:
        exe = hsflow.find_tool("hs-producer")
        if not exe:
            sys.exit("ddp_drafter: hs-producer not found (set HSFLOW_BIN_DIR)")
        to = "127.0.0.1:%d-%d" % (args.base_port, args.base_port + world - 1)  # one box
        procs = _support.start_producers("ddp_drafter", exe, args.loopback, to,
                                          args.producer_args)

    torch.manual_seed(0)
    model = None
    batches = tokens = 0
    waited = 0.0
    t_first = None
    loss = None
    try:
        while True:
            tw = time.perf_counter()
            try:
                b = consumer.next_batch(timeout=None)
            except StopIteration:
                break
            if batches:
                waited += time.perf_counter() - tw
            else:
                t_first = time.perf_counter()
            kH = b.n_layers * b.hidden_size
            if model is None:  # the same on every rank; DDP broadcasts rank 0's weights
                model = torch.nn.parallel.DistributedDataParallel(
                    torch.nn.Linear(kH, args.vocab, device=device),
                    device_ids=[local] if gpu is not None else None)
            hs = b.hidden_states.to(device)
            ids = b.input_ids.to(device).long()
            mask = b.loss_mask.to(device).bool()
            cu = b.cu_seqlens.to(device).long()
            valid = torch.ones(b.n_tokens, dtype=torch.bool, device=device)
            valid[cu[1:] - 1] = False
            valid &= torch.roll(mask, -1)
            target = torch.roll(ids, -1) % args.vocab
            logits = model(hs[valid].float())
            loss = F.cross_entropy(logits, target[valid])
            model.zero_grad(set_to_none=True)
            loss.backward()  # all-reduces the gradients across the ranks
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-args.lr)
            batches += 1
            tokens += b.n_tokens
    finally:
        el = time.perf_counter() - t_first if t_first else 0.0
        s = consumer.stats()
        consumer.close()
        _support.stop_producers(procs, 60)
    _support.say("ddp_drafter rank %d/%d: %d batches, %d tokens, %.0f tokens/s, waited for data "
                 "%.2f s (%.1f%%), loss %.4f, duplicates %d" % (
                     rank, world, batches, tokens, tokens / el if el > 0 else 0.0, waited,
                     100 * waited / el if el > 0 else 0.0, loss.item() if loss is not None else
                     float("nan"), s["duplicates"]))
    dist.barrier()
    dist.destroy_process_group()
    return 0 if s["finished"] and s["duplicates"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
