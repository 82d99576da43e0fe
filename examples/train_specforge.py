#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""train_specforge.py - SpecForge's DFlash-family drafter fed by hsflow.

Everything but the data is SpecForge's own (specforge 0.2): its run Config
(specforge.config.schema, the defaults of `specforge train`), its model
bundle (build_model_bundle: the draft config generated from the target,
DFlashDraftModel / DominoDraftModel / DSparkDraftModel, the target's
embeddings and lm_head, OnlineDFlashModel / OnlineDominoModel /
OnlineDSparkModel with its loss), its training backend (DDP under torchrun),
its optimizer (BF16Optimizer: AdamW over fp32 masters, gradient clipping at
max_grad_norm, the cosine or constant schedule with warm-up) and its step
(TrainerCore.train_step with the algorithm's step strategy: the loss
normalized over every rank's supervised tokens). The data is hsflow's: one
consumer per rank, each batch turned into the rows SpecForge's offline
collator makes (hsflow.integrations.specforge.batches).

The schedule's horizon is hsflow's plan: the batches the consumers deliver
over all epochs (SpecForge's own offline run computes it the same way from
its sample count).

A checkpoint (--checkpoint PATH; one file per rank under torchrun, PATH.rankR)
holds the model, the optimizer and its schedule, the RNG and
consumer.state_dict(); --resume starts from it and the consumers deliver
exactly the batches not trained on yet.

GPU node, 8 ranks, producers on the target nodes pointed at every rank:

    torchrun --nproc_per_node 8 examples/train_specforge.py --algorithm dflash \\
        --target /models/Qwen3-8B --listen-host 0.0.0.0 --base-port 7000 --gpu-per-rank \\
        --cache-gb 48 --epochs 3 --checkpoint /ckpt/dflash.pt --resume
    # it prints the producers' --layers (the drafter's target_layer_ids plus one):
    hs-producer --to drafter:7000-7007 --data train.hst --token-budget 32768 \\
        --model /models/Qwen3-8B --dflash-layers 1 --gpus 0,1,2,3

One box on the CPU, N local hs-producer processes getting the arguments
after `--` (--layers is added when not given):

    python examples/train_specforge.py --algorithm dflash --target ./tiny-qwen3 \\
        --mask-token-id 95 --epochs 3 --loopback 1 -- --data train.jsonl \\
        --token-budget 2048 --source model --model ./tiny-qwen3 --gpus cpu:1

Needs SpecForge 0.2's training code with torch and transformers
(scripts/install-engine-venv makes .venv-engines; SGLang is not needed).
"""
import argparse
import os
import sys
import time

import _support  # examples/_support.py, next to this script: finds hsflow in a checkout
import hsflow

ALGORITHMS = ("dflash", "domino", "dspark")


def parse_args(argv):
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        description="Train SpecForge's DFlash, Domino or DSpark drafter on hidden states "
                    "streamed by hsflow (one consumer per rank under torchrun).",
        usage="[torchrun ...] %(prog)s --algorithm dflash|domino|dspark --target DIR [options] "
              "[-- hs-producer options]")
    ap.add_argument("--algorithm", required=True, choices=ALGORITHMS,
                    help="SpecForge's drafter (training.strategy) to train")
    ap.add_argument("--target", required=True,
                    help="the target model folder: SpecForge generates the draft config from "
                         "its config and loads its embeddings and lm_head")
    ap.add_argument("--draft-config", default=None,
                    help="a SpecForge draft config JSON (model.draft_model_config, e.g. its "
                         "configs/qwen3-8b-dflash.json); default: generated from the target")
    ap.add_argument("--listen-host", default="127.0.0.1",
                    help="host the consumer listens on (127.0.0.1)")
    ap.add_argument("--base-port", type=int, default=7000,
                    help="the consumer listens on BASE_PORT + LOCAL_RANK (7000; with "
                         "--loopback and one rank: a free port)")
    ap.add_argument("--cache-gb", type=float, default=1.0, help="consumer cache, GiB (1)")
    ap.add_argument("--store", default=None, metavar="DIR",
                    help="the consumer's store (docs/store.md): batches stored there are read "
                         "from it, a complete store needs no producer")
    ap.add_argument("--epochs", type=int, default=1, help="epochs (training.num_epochs; 1)")
    ap.add_argument("--gpu-per-rank", action="store_true",
                    help="deliver to and train on GPU LOCAL_RANK (NCCL under torchrun); "
                         "default: the CPU")
    ap.add_argument("--num-layers", type=int, default=None,
                    help="draft decoder layers (model.draft_num_hidden_layers; SpecForge's "
                         "default 1 for a generated config)")
    ap.add_argument("--block-size", type=int, default=None,
                    help="draft block size (model.draft_block_size; SpecForge's default 16)")
    ap.add_argument("--mask-token-id", type=int, default=None,
                    help="the mask token (model.mask_token_id; default: SpecForge resolves one "
                         "from the target's tokenizer)")
    ap.add_argument("--attention-backend", default=None,
                    choices=["eager", "sdpa", "flex_attention"],
                    help="training.attention_backend (default: flex_attention on a GPU, sdpa "
                         "on the CPU)")
    ap.add_argument("--num-anchors", type=int, default=None,
                    help="training.num_anchors (SpecForge's default 512)")
    ap.add_argument("--lr", type=float, default=None,
                    help="training.learning_rate (SpecForge's default 1e-4)")
    ap.add_argument("--lr-scheduler", default=None, choices=["cosine", "constant"],
                    help="training.lr_scheduler (SpecForge's default cosine)")
    ap.add_argument("--warmup-ratio", type=float, default=None,
                    help="training.warmup_ratio (SpecForge's default 0.015)")
    ap.add_argument("--max-len", type=int, default=None,
                    help="cut each sample to this many tokens (data.max_length; SpecForge's "
                         "default 2048)")
    ap.add_argument("--max-refused", type=float, default=0.05,
                    help="fraction of samples without two consecutive supervised tokens that "
                         "may be refused before the run stops (0.05)")
    ap.add_argument("--seed", type=int, default=0, help="seed for the drafter's init (0)")
    ap.add_argument("--checkpoint", default=None,
                    help="checkpoint file (model, optimizer, schedule, consumer position); "
                         "written at the end, every --save-every batches and at --max-batches")
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
    if not os.path.isfile(os.path.join(args.target, "config.json")):
        ap.error("--target %s: no config.json there; give the target model's folder (the one "
                 "the producers' --model names)" % args.target)
    if args.algorithm != "dflash" and not args.draft_config:
        ap.error("--algorithm %s: SpecForge generates no draft config for %s; give --draft-config "
                 "(one of its configs/*-%s.json, or your own)" % (args.algorithm, args.algorithm,
                                                                  args.algorithm))
    if args.max_len is not None and args.max_len < 2:
        ap.error("--max-len must be >= 2")
    return args


def specforge_config(args, on_gpu, world):
    """SpecForge's run Config for this run: its defaults, the flags given."""
    from specforge.config.schema import Config
    model = {"target_model_path": args.target}
    for flag, key in (("num_layers", "draft_num_hidden_layers"), ("block_size", "draft_block_size"),
                      ("mask_token_id", "mask_token_id"), ("draft_config", "draft_model_config")):
        if getattr(args, flag) is not None:
            model[key] = getattr(args, flag)
    training = {"strategy": args.algorithm, "num_epochs": args.epochs,
                "attention_backend": args.attention_backend or
                ("flex_attention" if on_gpu else "sdpa")}
    if world > 1 and not on_gpu:
        training["fsdp_sharding"] = "NO_SHARD"  # SpecForge's DDP path; FSDP wants GPUs
    for flag, key in (("num_anchors", "num_anchors"), ("lr", "learning_rate"),
                      ("lr_scheduler", "lr_scheduler"), ("warmup_ratio", "warmup_ratio")):
        if getattr(args, flag) is not None:
            training[key] = getattr(args, flag)
    data = {"hidden_states_path": "hsflow"}  # the offline mode; hsflow is the source
    if args.max_len is not None:
        data["max_length"] = args.max_len
    return Config.model_validate({"model": model, "data": data, "training": training})


def checkpoint_path(args, rank, world):
    return args.checkpoint if world == 1 else "%s.rank%d" % (args.checkpoint, rank)


def save_checkpoint(torch, path, model, backend, consumer, step, total_steps, epoch_losses):
    state = backend.state_dict()  # SpecForge's: model, optimizer (+ schedule), rng
    state["model"] = model.state_dict()  # every rank's file whole (DDP gives rank 0 only)
    state.update(consumer=consumer.state_dict(), step=step, total_steps=total_steps,
                 epoch_losses=epoch_losses)
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        import torch.distributed as dist
        from specforge.algorithms.builtin import builtin_algorithm_registry
        from specforge.runtime.contracts import TrainBatch
        from specforge.training.assembly import _optimizer_factory, build_model_bundle
        from specforge.training.backend import FSDPTrainingBackend, ParallelConfig
        from specforge.training.controller import TrainerCore
        from hsflow.integrations import specforge as hs_sf
    except ImportError as e:
        sys.exit("train_specforge: needs SpecForge 0.2 and torch (%s): "
                 "scripts/install-engine-venv" % e)
    distributed, rank, world, local = _support.torchrun_rank()
    gpu = local if args.gpu_per_rank else None
    if gpu is not None:
        torch.cuda.set_device(gpu)
    else:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # SpecForge builds on its local device
    if distributed:
        dist.init_process_group("nccl" if gpu is not None else "gloo")
    else:  # SpecForge's optimizer and checkpoint code expect a process group, as its trainer has
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    torch.manual_seed(args.seed)
    cfg = specforge_config(args, gpu is not None, world)
    registration = builtin_algorithm_registry().resolve(args.algorithm)
    bundle = build_model_bundle(cfg, algorithm=registration)
    model = bundle.model
    layers = hs_sf.producer_layers(model)
    if rank == 0:
        print("train_specforge: %s drafter, %d layers, target_layer_ids %s; the producers must "
              "send --layers %s" % (args.algorithm, bundle.draft_model.config.num_hidden_layers,
                                     hs_sf.target_layer_ids(model), ",".join(map(str, layers))),
              flush=True)

    ckpt = checkpoint_path(args, rank, world) if args.checkpoint else None
    resume, state, step, epoch_losses = None, None, 0, {}
    if args.resume and os.path.exists(ckpt):
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        resume, step = state["consumer"], state["step"]
        epoch_losses = state.get("epoch_losses", {})
        print("train_specforge rank %d: resumed from %s at step %d" % (rank, ckpt, step),
              flush=True)

    port = args.base_port + local
    if args.loopback and world == 1:
        port = 0
    consumer = hsflow.Consumer(listen="%s:%d" % (args.listen_host, port), gpu=gpu,
                               cache_gb=args.cache_gb, epochs=args.epochs, arrays="torch",
                               resume=resume, store=args.store)
    procs = []
    if args.loopback and rank == 0:
        procs = _support.start_loopback_producers("train_specforge", args, consumer.port, world,
                                                  layers)

    def producers_alive():  # with --loopback: stop when they all exited early
        if procs and all(p.poll() is not None for p in procs):
            raise RuntimeError("every hs-producer exited (codes %s) and batches are "
                               "missing; their messages are above"
                               % [p.returncode for p in procs])

    feed = hs_sf.batches(consumer, model, with_batch=True, max_len=args.max_len or
                         cfg.data.max_length, max_refused=args.max_refused,
                         idle=producers_alive if procs else None)
    done = tokens = 0
    sums = {}
    total_steps = None
    core = backend = None
    rc = 0
    t0 = t_last = time.perf_counter()
    try:
        for b, d in feed:
            if core is None:
                # the horizon: hsflow's plan, known with the first batch
                total_steps = step + consumer.stats()["batches_planned"]
                if state is not None and state.get("total_steps") not in (None, total_steps):
                    raise RuntimeError("the checkpoint's schedule spans %d steps, this run's "
                                       "plan %d: resume with the same data, budget and epochs"
                                       % (state["total_steps"], total_steps))
                factory = _optimizer_factory(cfg)
                factory.configure_total_steps(total_steps)
                parallel = ParallelConfig.from_distributed(
                    sharding_strategy=cfg.training.fsdp_sharding)
                backend = FSDPTrainingBackend(parallel, optimizer_factory=factory)
                wrapped = backend.prepare_model(model, wrap=distributed,
                                                optimizer_target=model.draft_model)
                if state is not None:
                    backend.load_state_dict(state)
                    state = None
                strategy = registration.providers.step.build(
                    wrapped, target_head=bundle.target_head,
                    **dict(bundle.strategy_kwargs.options))
                core = TrainerCore(strategy, backend,
                                   accumulation_steps=cfg.training.accumulation_steps)
            result = core.train_step(TrainBatch(
                sample_ids=[str(i) for i in feed.rows], strategy=args.algorithm, tensors=d))
            step += 1
            done += 1
            tokens += feed.tokens
            s = sums.setdefault(b.epoch, [0.0, 0])
            s[0] += result.loss
            s[1] += 1
            now = time.perf_counter()  # result.loss is a float: the step is over
            print("step %d epoch %d loss %.4f lr %.3g tokens %d ms %.1f" % (
                step, b.epoch, result.loss, backend.optimizer.get_learning_rate(), feed.tokens,
                (now - t_last) * 1e3), flush=True)
            t_last = now
            if ckpt and args.save_every and step % args.save_every == 0:
                save_checkpoint(torch, ckpt, model, backend, consumer, step, total_steps,
                                _merge(epoch_losses, sums))
            if args.max_batches and done >= args.max_batches:
                break
        if ckpt and backend is not None:
            save_checkpoint(torch, ckpt, model, backend, consumer, step, total_steps,
                            _merge(epoch_losses, sums))
    except KeyboardInterrupt:
        rc = 130
    except (RuntimeError, hs_sf.RefusedError) as e:
        if not (isinstance(e, hs_sf.RefusedError) or str(e).startswith("every hs-producer") or
                str(e).startswith("the checkpoint's schedule")):
            raise
        print("train_specforge: %s" % e, file=sys.stderr, flush=True)
        rc = 1
    finally:
        el = time.perf_counter() - t0
        stats = consumer.stats()
        consumer.close()
        _support.stop_producers(procs, 60)
    for e, (tot, n) in sorted(_merge(epoch_losses, sums).items()):
        _support.say("train_specforge rank %d: epoch %d mean loss %.4f over %d batches"
                     % (rank, e, tot / n, n))
    _support.say("train_specforge rank %d/%d: %d batches this run (%d steps in all), %d "
                 "tokens, %.0f tokens/s, %d sample(s) refused, consumer %d/%d batches delivered"
                 % (rank, world, done, step, tokens, tokens / el if el > 0 else 0.0,
                    feed.refused, stats["batches_delivered"], stats["batches_planned"]))
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
