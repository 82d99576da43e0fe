#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""train_speculators.py - speculators' EAGLE-3 or DFlash drafter fed by hsflow.

The drafter is speculators' own (Eagle3DraftModel / DFlashDraftModel), built
from the target folder exactly as `speculators train` builds it (its
TrainConfig defaults, build_draft_model, from_training_args), trained with
its optimisers (build_optimizers: Muon and AdamW by default) and its loss (the model's forward
with get_trainer_kwargs, gradient clipping at 1.0 as its Trainer does). The
data is hsflow's: one consumer per rank, each batch turned into the dict
speculators' collate makes (hsflow.integrations.speculators.batches).

A checkpoint (--checkpoint PATH; one file per rank under torchrun, PATH.rankR)
holds the model, the optimiser, the LR schedule and consumer.state_dict();
--resume starts from it and the consumers deliver exactly the batches not
trained on yet. The learning rate follows speculators' schedules (linear by
default, or cosine, or none; warm-up --warmup-steps, 1% of the run's steps by
default, as speculators), over the run's planned batches. --val-fraction F
holds out a fixed share of the plan's batches (by batch id, the same every
epoch): never trained on, their loss is computed as they come and reported
per epoch. --save-pretrained DIR writes the drafter with speculators' own
save_pretrained at the end, the format vLLM loads. --store DIR reads and
keeps the states in an hsflow store (a complete one needs no producer);
--expect PIN (the `pin` line of `hs-data plan`) pins the run.

GPU node, 8 ranks, producers on the target nodes pointed at every rank:

    torchrun --nproc_per_node 8 examples/train_speculators.py --algorithm dflash \\
        --target /models/Qwen3-8B --listen-host 0.0.0.0 --base-port 7000 --gpu-per-rank \\
        --cache-gb 48 --epochs 3 --checkpoint /ckpt/dflash.pt --resume
    # it prints the producers' --layers (the drafter's target_layer_ids, then L):
    hs-producer --to drafter:7000-7007 --data train.hst --token-budget 32768 \\
        --model /models/Qwen3-8B --layers 2,18,33,36 --gpus 0,1,2,3

From a complete store alone, pinned, with validation, saved as vLLM loads it:

    python examples/train_speculators.py --algorithm eagle3 --target /models/Qwen3-8B \
        --gpu-per-rank --store /data/hs-store --expect "$(hs-data plan train.hst \
        --token-budget 32768 --hidden-size 4096 --layers 2,18,33,36 | sed -n 's/^pin *//p')" \
        --epochs 3 --lr-schedule cosine --val-fraction 0.05 --save-pretrained /ckpt/eagle3

One box on the CPU, N local hs-producer processes getting the arguments
after `--` (--layers is added when not given):

    python examples/train_speculators.py --algorithm eagle3 --target ./tiny-llama \\
        --epochs 3 --loopback 1 -- --data train.jsonl --token-budget 2048 \\
        --source model --model ./tiny-llama --gpus cpu:1

Needs speculators 0.9 (pip install 'hsflow[speculators]'; its pins:
torch <= 2.14.1, transformers <= 5.19; scripts/install-engine-venv).
"""
import argparse
import os
import sys
import time

import _support  # examples/_support.py, next to this script: finds hsflow in a checkout
import hsflow


def pad_to_arg(v):
    if v == "auto":
        return v
    if not v.isdigit() or int(v) < 1:
        raise argparse.ArgumentTypeError("%r: give a whole number of tokens >= 1, or auto" % v)
    return int(v)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        description="Train speculators' EAGLE-3 or DFlash drafter on hidden states streamed by "
                    "hsflow (one consumer per rank under torchrun).",
        usage="[torchrun ...] %(prog)s --algorithm eagle3|dflash --target DIR [options] "
              "[-- hs-producer options]")
    ap.add_argument("--algorithm", required=True, choices=["eagle3", "dflash"],
                    help="speculators' drafter to train")
    ap.add_argument("--target", required=True,
                    help="the target (verifier) model folder: speculators reads its config, "
                         "embeddings, lm_head and final norm from it")
    ap.add_argument("--listen-host", default="127.0.0.1",
                    help="host the consumer listens on (127.0.0.1)")
    ap.add_argument("--base-port", type=int, default=7000,
                    help="the consumer listens on BASE_PORT + LOCAL_RANK (7000; with "
                         "--loopback and one rank: a free port)")
    ap.add_argument("--cache-gb", type=float, default=1.0, help="consumer cache, GiB (1)")
    ap.add_argument("--epochs", type=int, default=1, help="epochs to train (1)")
    ap.add_argument("--gpu-per-rank", action="store_true",
                    help="deliver to and train on GPU LOCAL_RANK (NCCL under torchrun); "
                         "default: the CPU")
    ap.add_argument("--num-layers", type=int, default=None,
                    help="draft decoder layers (speculators' default: 1 for eagle3, 5 for "
                         "dflash)")
    ap.add_argument("--target-layer-ids", default=None,
                    help="comma-separated target layers the drafter reads (hsflow indices; "
                         "default speculators': 2,N//2,N-3)")
    ap.add_argument("--draft-attn-impl", default=None,
                    choices=["simple_flex_attention", "sdpa", "eager"],
                    help="draft attention (default: simple_flex_attention on a GPU, sdpa on "
                         "the CPU)")
    ap.add_argument("--pad-to", default="auto", type=pad_to_arg, metavar="N|auto",
                    help="pad each row up to a multiple of N tokens, as speculators pads to "
                         "--total-seq-len (a token budget here gives every step one shape); "
                         "auto: 128 where the drafter needs whole flex blocks (EAGLE-3 on "
                         "simple_flex_attention), else none")
    ap.add_argument("--loss-implementation", default=None, choices=["fused", "eager"],
                    help="speculators' loss kernels (default: fused on a GPU, eager on the CPU)")
    ap.add_argument("--mask-token-id", type=int, default=None,
                    help="the mask token (DFlash's; speculators resolves one for EAGLE-3 "
                         "too; default: from the target's tokenizer, as speculators does)")
    ap.add_argument("--block-size", type=int, default=None, help="DFlash block size")
    ap.add_argument("--max-anchors", type=int, default=None, help="DFlash anchors per batch")
    ap.add_argument("--ttt-steps", type=int, default=None, help="EAGLE-3 TTT steps (3)")
    ap.add_argument("--lr", type=float, default=None,
                    help="learning rate (speculators' default 1e-3; Muon's too unless "
                         "--muon-lr)")
    ap.add_argument("--optimizer", default=None, choices=["muon", "adamw"],
                    help="speculators' optimiser: muon (its default: Muon for 2D weights, "
                         "AdamW for the rest) or adamw")
    ap.add_argument("--lr-schedule", default="linear", choices=["linear", "cosine", "none"],
                    help="speculators' schedules (transformers' with warm-up): linear decay to "
                         "0 (its default), cosine, or none (constant)")
    ap.add_argument("--warmup-steps", type=int, default=None,
                    help="warm-up steps (default: 1%% of the run's steps, as speculators)")
    ap.add_argument("--val-fraction", type=float, default=0.0,
                    help="hold out this share of the plan's batches for validation (by batch "
                         "id, the same each epoch; one rank only); default 0: none")
    ap.add_argument("--save-pretrained", metavar="DIR", default=None,
                    help="write the trained drafter to DIR with speculators' save_pretrained "
                         "(config.json and safetensors, as vLLM loads it)")
    ap.add_argument("--store", metavar="DIR", default=None,
                    help="the consumer's hidden-state store: read what it holds, keep what "
                         "producers send (a complete store needs no producer)")
    ap.add_argument("--expect", metavar="PIN", default=None,
                    help="pin the run: the `pin` line of hs-data plan (--expect-plan X "
                         "--expect-dataset Y --expect-layout Z); producers or a store that "
                         "differ are refused")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed for the drafter's init and the validation split (0)")
    ap.add_argument("--checkpoint", default=None,
                    help="checkpoint file (model, optimiser, consumer position); written at "
                         "the end, every --save-every batches and at --max-batches")
    ap.add_argument("--save-every", type=int, default=0, help="checkpoint every N batches")
    ap.add_argument("--resume", action="store_true",
                    help="start from --checkpoint when it exists")
    ap.add_argument("--max-batches", type=int, default=0,
                    help="stop (checkpointing) after this many batches in this run")
    ap.add_argument("--loopback", type=int, default=0, metavar="N",
                    help="rank 0 starts N local hs-producer processes with the arguments "
                         "after -- (pointed at every rank)")
    args = _support.parse_args(ap, argv, " (at least --data, --token-budget, --source model "
                                         "--model DIR)")
    if args.resume and not args.checkpoint:
        ap.error("--resume needs --checkpoint PATH")
    if not 0.0 <= args.val_fraction < 1.0:
        ap.error("--val-fraction %g: give a share in [0, 1)" % args.val_fraction)
    if args.warmup_steps is not None and args.warmup_steps < 0:
        ap.error("--warmup-steps must be >= 0")
    if not os.path.isfile(os.path.join(args.target, "config.json")):
        ap.error("--target %s: %s; give the target (verifier) model's local folder, the one "
                 "with config.json and the weights" % (
                     args.target, "no config.json there" if os.path.isdir(args.target)
                     else "no such folder"))
    return args


def is_val(batch, fraction, seed):
    """Whether plan batch `batch` is held out (the same in every epoch and run)."""
    import random
    return fraction > 0 and random.Random("%d:%d" % (seed, batch)).random() < fraction


def make_schedulers(opts, kind, warmup, total):
    """speculators' schedulers (its Trainer: transformers' linear or cosine
    with warm-up), one per optimiser; none: constant."""
    if kind == "none":
        return []
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup
    make = get_linear_schedule_with_warmup if kind == "linear" else \
        get_cosine_schedule_with_warmup
    return [make(o, num_warmup_steps=warmup, num_training_steps=total) for o in opts]


def speculators_config(args, on_gpu):
    """speculators' flat training args (TrainConfig defaults and derived
    defaults, as its CLI resolves them) for this run."""
    from speculators.train.config.schema import TrainConfig
    flat = {"speculator_type": args.algorithm, "verifier_name_or_path": args.target,
            "draft_attn_impl": args.draft_attn_impl or
            ("simple_flex_attention" if on_gpu else "sdpa"),
            "loss_implementation": args.loss_implementation or ("fused" if on_gpu else "eager")}
    for key in ("num_layers", "mask_token_id", "block_size", "max_anchors", "ttt_steps", "lr",
                "optimizer"):
        if getattr(args, key) is not None:
            flat[key] = getattr(args, key)
    if args.target_layer_ids:
        flat["target_layer_ids"] = [int(x) for x in args.target_layer_ids.split(",")]
    return TrainConfig.from_flat(flat).flatten()


def build_model(args, flat):
    """The drafter, built as speculators' CLI builds it (no vocab mapping:
    the target's full vocabulary)."""
    import argparse as _ap
    from speculators.model import SpeculatorModel
    from speculators.models.utils import get_verifier_config
    from speculators.train.cli import build_draft_model
    model_class = SpeculatorModel.registry[args.algorithm]
    vocab = get_verifier_config(args.target).vocab_size
    ns = _ap.Namespace(**flat)
    try:
        model = build_draft_model(ns, model_class, None, None, vocab)
    except ValueError as e:
        if ns.mask_token_id is None and "processor" in str(e):
            sys.exit("train_speculators: speculators looks for the mask token in the target's "
                     "tokenizer and %s has none: pass --mask-token-id ID" % args.target)
        raise
    return model, model_class


def checkpoint_path(args, rank, world):
    return args.checkpoint if world == 1 else "%s.rank%d" % (args.checkpoint, rank)


def save_checkpoint(torch, path, model, opts, consumer, step, epoch_losses, sched=None):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizers": [o.state_dict() for o in opts],
                "consumer": consumer.state_dict(), "step": step,
                "epoch_losses": epoch_losses, "schedule": sched}, tmp)
    os.replace(tmp, path)


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        import torch.distributed as dist
        from speculators.train.optimizers import build_optimizers
        from hsflow.integrations import speculators as hs_spec
    except ImportError as e:
        sys.exit("train_speculators: needs speculators 0.9 and torch (%s): pip install "
                 "'hsflow[speculators]', or scripts/install-engine-venv" % e)
    distributed, rank, world, local = _support.torchrun_rank()
    gpu = local if args.gpu_per_rank else None
    device = torch.device("cuda:%d" % local if gpu is not None else "cpu")
    if gpu is not None:
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if gpu is not None else "gloo")
    if args.val_fraction and world > 1:
        sys.exit("train_speculators: --val-fraction with %d ranks: DDP needs every rank to step "
                 "on every batch; validate with one rank" % world)

    torch.manual_seed(args.seed)
    flat = speculators_config(args, gpu is not None)
    model, model_class = build_model(args, flat)
    model.to(device)
    train_kwargs, val_kwargs = model_class.get_trainer_kwargs(**flat)
    layers = hs_spec.producer_layers(model)
    if rank == 0:
        print("train_speculators: %s drafter, %d layers, target layers %s; the producers must "
              "send --layers %s" % (args.algorithm, flat["num_layers"],
                                     hs_spec.target_layers(model), ",".join(map(str, layers))),
              flush=True)
    # speculators' optimisers as its Trainer builds them: Muon for the 2D
    # weights and AdamW for the rest by default (--optimizer adamw: one AdamW)
    opts = build_optimizers(model, argparse.Namespace(**flat))

    ckpt = checkpoint_path(args, rank, world) if args.checkpoint else None
    resume, step, epoch_losses, saved_sched = None, 0, {}, None
    if args.resume and os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        for o, sd in zip(opts, state["optimizers"], strict=True):
            o.load_state_dict(sd)
        resume, step = state["consumer"], state["step"]
        epoch_losses = state.get("epoch_losses", {})
        saved_sched = state.get("schedule")
        print("train_speculators rank %d: resumed from %s at step %d" % (rank, ckpt, step),
              flush=True)
    train_model = model
    if distributed:
        train_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[local] if gpu is not None else None)

    port = args.base_port + local
    if args.loopback and world == 1:
        port = 0
    try:
        consumer = hsflow.Consumer(listen="%s:%d" % (args.listen_host, port), gpu=gpu,
                                   cache_gb=args.cache_gb, epochs=args.epochs, arrays="torch",
                                   resume=resume, store=args.store, expect=args.expect)
    except (hsflow.HsflowError, ValueError) as e:  # a store or pin that refuses the run
        sys.exit("train_speculators: the consumer refused to start: %s" % e)
    procs = []
    if args.loopback and rank == 0:
        procs = _support.start_loopback_producers("train_speculators", args, consumer.port,
                                                  world, layers)

    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    done = tokens = 0
    sums, vals = {}, {}
    sched = saved_sched  # {"total", "warmup", "kind", "states"}
    schedulers = None
    t0 = time.perf_counter()
    rc = 0
    try:
        def producers_alive():  # with --loopback: stop when they all exited early
            if procs and all(p.poll() is not None for p in procs):
                raise RuntimeError("every hs-producer exited (codes %s) and batches are "
                                   "missing; their messages are above"
                                   % [p.returncode for p in procs])

        for b, d in hs_spec.batches(consumer, train_model, with_batch=True, pad_to=args.pad_to,
                                    idle=producers_alive if procs else None):
            epoch = b.epoch
            if is_val(b.batch, args.val_fraction, args.seed):
                model.eval()
                with torch.no_grad(), autocast:
                    _, vloss, _ = model(**d, **val_kwargs)
                model.train()
                v = vals.setdefault(epoch, [0.0, 0])
                v[0] += float(vloss.item())
                v[1] += 1
                done += 1
                continue
            if schedulers is None:  # the run's length is known once its plan is
                if sched is None:
                    # this run's batches less the held-out ones (one rank: every batch id
                    # of the plan in each epoch; refused with several)
                    planned = consumer.stats()["batches_planned"]
                    per_epoch = -(-planned // args.epochs)
                    held = sum(is_val(i, args.val_fraction, args.seed) for i in range(per_epoch))
                    total = step + max(1, planned - held * args.epochs)
                    warmup = args.warmup_steps if args.warmup_steps is not None else total // 100
                    sched = {"total": total, "warmup": warmup, "kind": args.lr_schedule}
                schedulers = make_schedulers(opts, sched["kind"], sched["warmup"], sched["total"])
                for sc, sd in zip(schedulers, sched.get("states") or []):
                    sc.load_state_dict(sd)
                if rank == 0:
                    print("train_speculators: lr %s, %s schedule over %d steps, %d of warm-up"
                          % (flat["lr"], sched["kind"], sched["total"], sched["warmup"]),
                          flush=True)
            with autocast:
                _, loss, _ = train_model(**d, **train_kwargs)
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            cur_lr = opts[0].param_groups[0]["lr"]
            for o in opts:
                o.step()
            for sc in schedulers:
                sc.step()
            if schedulers:
                sched["states"] = [sc.state_dict() for sc in schedulers]
            step += 1
            done += 1
            tokens += int(d["input_ids"].shape[1])
            lv = float(loss.item())
            s = sums.setdefault(epoch, [0.0, 0])
            s[0] += lv
            s[1] += 1
            print("step %d epoch %d loss %.4f lr %.3g" % (step, epoch, lv, cur_lr), flush=True)
            if ckpt and args.save_every and step % args.save_every == 0:
                save_checkpoint(torch, ckpt, model, opts, consumer, step,
                                _merge(epoch_losses, sums), sched)
            if args.max_batches and done >= args.max_batches:
                break
        if ckpt:
            save_checkpoint(torch, ckpt, model, opts, consumer, step, _merge(epoch_losses, sums),
                            sched)
        if args.save_pretrained and rank == 0:
            model.save_pretrained(args.save_pretrained)  # speculators' own: what vLLM loads
            print("train_speculators: drafter saved to %s (speculators' save_pretrained)"
                  % args.save_pretrained, flush=True)
    except KeyboardInterrupt:
        rc = 130
    except RuntimeError as e:
        if not str(e).startswith("every hs-producer exited"):
            raise
        print("train_speculators: %s" % e, file=sys.stderr, flush=True)
        rc = 1
    finally:
        el = time.perf_counter() - t0
        stats = consumer.stats()
        consumer.close()
        _support.stop_producers(procs, 60)
    for e, (tot, n) in sorted(_merge(epoch_losses, sums).items()):
        _support.say("train_speculators rank %d: epoch %d mean loss %.4f over %d batches"
                     % (rank, e, tot / n, n))
    for e, (tot, n) in sorted(vals.items()):
        _support.say("train_speculators rank %d: epoch %d validation loss %.4f over %d held-out "
                     "batches" % (rank, e, tot / n, n))
    _support.say("train_speculators rank %d/%d: %d batches this run (%d steps in all), %d tokens, "
                 "%.0f tokens/s, consumer %d/%d batches delivered"
                 % (rank, world, done, step, tokens, tokens / el if el > 0 else 0.0,
                    stats["batches_delivered"], stats["batches_planned"]))
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return rc


def _merge(before, now):
    """Per-epoch [sum, count] of the loss, the checkpoint's and this run's."""
    out = {int(e): list(v) for e, v in before.items()}
    for e, (tot, n) in now.items():
        s = out.setdefault(int(e), [0.0, 0])
        s[0] += tot
        s[1] += n
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
