"""Serial vs threaded rollout generation for agents on different devices.

Two agents (GPT-2 built from a config over the byte vocabulary, size set by the flags) are placed on
two devices: ``cuda:0`` and ``cuda:1`` when there are two GPUs, else ``cuda:0`` and ``cpu``. Each
repeat times ``Team.generate`` (one batched ``generate`` per agent) serially and with one
thread per device, same seeds, and prints the times and the ratio serial / threaded (> 1: overlap
helps; 2.0 is the ceiling for two equal agents on two GPUs).

    python benchmarks/speed/agent_overlap.py [--layers 12 --width 768 --batch 16 --k 4 --new-tokens 128]

Without a GPU it prints a message and exits 0: threads on one CPU only contend, so there is
nothing honest to measure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def _sync(devices: list[torch.device]) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--batch", type=int, default=16, help="prompts per agent")
    parser.add_argument("--k", type=int, default=4, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print(
            "agent_overlap: no CUDA device available; this benchmark needs >= 2 GPUs (or 1 GPU + CPU). Nothing measured."
        )
        return 0
    devices = ["cuda:0", "cuda:1"] if torch.cuda.device_count() >= 2 else ["cuda:0", "cpu"]

    from comlrl_lightning import MAGRPO, RolloutConfig, SamplingConfig
    from comlrl_lightning.infra.strategy import place_module, plan_devices

    kwargs = {"n_layer": args.layers, "n_embd": args.width, "n_head": args.heads, "n_positions": 1024}
    spec = {"model": "builtin:tiny-gpt2", "model_kwargs": kwargs}
    model = MAGRPO(agents=[spec, dict(spec)], rollout=RolloutConfig(num_generations=args.k),
                   sampling=SamplingConfig(max_new_tokens=args.new_tokens))  # fmt: skip
    model.configure_model()
    for agent in model.agents:
        agent.generation_config.min_new_tokens = args.new_tokens  # equal work in both modes
    place_module(model, plan_devices(model, devices, root=devices[0]))
    placed = [model.team.device(i) for i in range(2)]
    params = sum(p.numel() for p in model.agents[0].parameters())
    prompts = [
        [f"Agent {i} prompt number {b}: write about topic {b % 7}." for b in range(args.batch)]
        for i in range(2)
    ]

    def timed(concurrent: bool) -> float:
        model.concurrent_agents = concurrent
        torch.manual_seed(0)
        _sync(placed)
        t0 = time.perf_counter()
        model.team.generate(prompts, args.k)
        _sync(placed)
        return time.perf_counter() - t0

    timed(False), timed(True)  # warm-up (CUDA context, kernels, allocator)
    serial, threaded = [], []
    for _ in range(args.repeats):
        serial.append(timed(False))
        threaded.append(timed(True))
    s, t = statistics.median(serial), statistics.median(threaded)
    print(
        f"agents: 2 x {params / 1e6:.1f}M params on {devices}; {args.batch} prompts x K={args.k}, {args.new_tokens} new tokens"
    )
    print(f"serial   Team.generate: median {s:.3f} s  ({', '.join(f'{x:.3f}' for x in serial)})")
    print(f"threaded Team.generate: median {t:.3f} s  ({', '.join(f'{x:.3f}' for x in threaded)})")
    print(f"ratio serial/threaded: {s / t:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
