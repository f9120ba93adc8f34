"""The reduced-scale reproduction of the DAPE V2 paper (issue 7), issue 19's controls and issue 29's
single-epoch 125M runs, as lists of jobs.

Every language-model job trains the `small` preset (6 layers, d 384, 12 heads) with the same data,
tokenizer, seed policy and token budget (2000 steps x 8192 tokens), then evaluates it with the same
windows. `python scripts/repro/plan.py [repro|controls|epoch] > plan.json` writes the plan that run_jobs.py
executes; `controls` also holds issue 19's 125M runs (exclusive jobs: one at a time on the last GPU);
`epoch` is 125M runs only, each alone on a GPU (solo jobs: one per GPU at once).
Jobs are listed in priority order: the machine may be taken back before the last ones run.
"""

import json
import os
import sys

# REPRO_SMOKE=1: the same plan at toy sizes on a CPU, to check every command before device time is spent.
SMOKE = os.environ.get("REPRO_SMOKE") == "1"
STEPS = 4 if SMOKE else 2000
TOKENS_PER_STEP = 64 * 128  # the batch shrinks as the training length grows: same tokens per method

RUN1 = ["cope", "xl", "fire", "dape-kerple", "dapev2-kerple", "dapev2-rope", "dapev2-nope", "stickbreaking",
        "nope", "rope", "t5", "alibi", "kerple"]  # slow ones first: they balance the GPUs
HEADLINE = ["rope", "kerple", "dape-kerple", "dapev2-kerple", "stickbreaking"]
CHE_METHODS = ["rope", "alibi", "kerple", "dape-kerple", "dapev2-kerple", "stickbreaking"]
TIMING_METHODS = ["nope", "rope", "t5", "alibi", "kerple", "fire", "cope", "xl", "dape-kerple", "dapev2-kerple",
                  "dapev2-rope", "dapev2-nope", "stickbreaking"]
RUNS = "runs/repro"


def train_and_eval(preset: str, sets: list[str], run: str) -> str:
    return (f"python3 -m lenx train -c {preset} " + " ".join(f"--set {s}" for s in sets) + f" --out {run} --no-progress"
            f" && python3 -m lenx eval {run} --no-progress")


def lm_job(experiment: str, method: str, seed: int = 0, seq_len: int = 128, corpus: str = "tech",
           max_length: int = 8192, extra: tuple = (), name: str | None = None, maps: bool = False,
           batch_size: int | None = None, root: str = RUNS) -> dict:
    """batch_size: sequences per step; by default the same tokens per step at every training length."""
    name = name or f"{method}-s{seed}"
    run = f"{root}/{experiment}/{name}"
    sets = [f"model.method={method}", f"train.seed={seed}", f"train.steps={STEPS}", f"train.seq_len={seq_len}",
            f"train.batch_size={batch_size or TOKENS_PER_STEP // seq_len}", f"train.ckpt_every={STEPS // 2}",
            f"data.corpus={corpus}", f"eval.max_length={max_length}", *extra]
    if SMOKE:
        sets += ["model.n_layer=6", "model.d_model=96", "eval.windows=2", f"eval.max_length={2 * seq_len + 256}",
                 "train.device=cpu"]
    cmd = train_and_eval("small", sets, run)
    if maps:  # the paper's appendix K pictures: raw scores, bias, processed scores (layers 0 and 5, head 0)
        cmd += "".join(f" && python3 -m lenx plot {run} --attention --length 256 --layer {layer} --head 0"
                       for layer in (0, 5))
    return {"id": f"{experiment}/{name}", "kind": "lm", "run": run, "cmd": cmd}


def che_job(method: str, seed: int) -> dict:
    run = f"{RUNS}/che/{method}-s{seed}"
    cmd = (f"python3 -m lenx che --preset gpu --methods {method} --seeds {seed} --steps 2000 --test-samples 256 "
           f"--test-length-step 5 --out {run} --no-progress")
    if SMOKE:
        cmd = cmd.replace("--steps 2000", "--steps 2") + " --tasks parity_check,reverse_string --test-max-length 50"
    return {"id": f"che/{method}-s{seed}", "kind": "small", "run": run, "cmd": cmd}


def timing_job() -> dict:
    run = f"{RUNS}/timing"
    cmd = (f"mkdir -p {run} && python3 -m lenx bench --train-step --preset 125m --seq-len 512 --batch 32 "
           f"--steps 20 --methods {','.join(TIMING_METHODS)} --out {run}/train_step.json")
    if SMOKE:
        cmd = cmd.replace("--preset 125m --seq-len 512 --batch 32 --steps 20", "--preset tiny --seq-len 64 --batch 2 "
                          "--steps 2 --device cpu")
    return {"id": "timing", "kind": "exclusive", "run": run, "cmd": cmd}


def plan() -> list[dict]:
    jobs = [timing_job()]
    jobs += [che_job(m, s) for s in (0, 1) for m in CHE_METHODS]
    # Run 1 (figures 1, 2, 5): train at 128 on tech, evaluate 256 .. 16384.
    jobs += [lm_job("tech-T128", m, max_length=16384, maps=m in ("kerple", "dapev2-kerple")) for m in RUN1]
    # Run 4 (section 4.5): the leaking DAPE V2 (no tril) next to the leak-free one of run 1.
    jobs.append(lm_job("leak", "dapev2-kerple", extra=("model.dape_leak=true",), name="dapev2-kerple-leak-s0"))
    # Run 3 (table 4): kernel sizes 1, 5, 7 (k = 3 is run 1's dapev2-kerple).
    jobs += [lm_job("kernel-size", "dapev2-kerple", max_length=16384, extra=(f"model.dape_kernel={k}",),
                    name=f"dapev2-kerple-k{k}-s0") for k in (1, 5, 7)]
    # Run 2: training length 512 on tech, and 128 on books.
    jobs += [lm_job("tech-T512", m, seq_len=512) for m in HEADLINE]
    jobs += [lm_job("books-T128", m, corpus="books") for m in HEADLINE]
    # Figure 5's other bases.
    jobs += [lm_job("tech-T128", m, max_length=16384) for m in ("dapev2-alibi", "dapev2-fire")]
    # More seeds for run 1: the headline methods first.
    rest = [m for m in RUN1 if m not in HEADLINE]
    jobs += [lm_job("tech-T128", m, seed=s, max_length=16384) for s in (1, 2) for m in HEADLINE]
    jobs += [lm_job("tech-T128", m, seed=s, max_length=16384) for s in (1, 2) for m in rest]
    return jobs


CONTROLS = "runs/controls"
V125_STEPS = 4 if SMOKE else 3000


def v125_job(method: str, seed: int) -> dict:
    """One 125M run of issue 19 (the recipe of results/v125, REPORT section 9), evaluated right after
    training; the 1.2 GB checkpoint is deleted once the evaluation has run (it cannot be brought back)."""
    run = f"{CONTROLS}/v125/{method}-s{seed}"
    sets = [f"model.method={method}", f"train.seed={seed}", f"train.steps={V125_STEPS}", "train.ckpt_every=1000",
            "train.val_every=250", "train.val_batches=16", "data.root=data-long", "eval.max_length=16384"]
    if SMOKE:
        sets += ["model.n_layer=2", "model.d_model=96", "train.batch_size=2", "eval.windows=2",
                 "eval.max_length=512", "train.device=cpu"]
    cmd = train_and_eval("125m", sets, run) + f" && rm -rf {run}/ckpt"
    return {"id": f"v125/{method}-s{seed}", "kind": "exclusive", "run": run, "cmd": cmd}


EPOCH = "runs/epoch"
# 3052 steps x 32768 tokens (256 x 128, 64 x 512, 16 x 2048) = 100.0M tokens: one pass over the first 0.30
# of the `code` corpus's train split (train.sampling=pass: every window at most once). The pass reads
# whole blocks of 64 steps, so every length reads tokens [0, 100663297): shards 00000-00003 of 30M tokens
# (scripts/data/shards_for_steps.py).
EPOCH_STEPS = 4 if SMOKE else 3052
EPOCH_TOKENS_PER_STEP = 256 * 128  # the 125m preset's batch at T 128


def suite_commands(run: str, seq_len: int, samples: int = 4) -> str:
    """Issue 44 part 3: the synthetic suite (RULER- and BABILong-style) at the training length, 4x it and
    16384, 4 inputs a cell, scored before the checkpoint is deleted (results stay, weights cannot)."""
    lengths = sorted({max(seq_len, 256), 4 * seq_len, 16384})  # cwe needs 129 tokens or more
    if SMOKE:
        lengths, samples = [256, 512], 1
    return "".join(f" && python3 -m lenx eval {run} --task {task} --lengths {','.join(map(str, lengths))} "
                   f"--samples {samples} --no-progress" for task in ("ruler", "babilong"))


def epoch_job(method: str, seed: int, extra: tuple = (), name: str | None = None, seq_len: int = 128,
              root: str = EPOCH, experiment: str = "epoch", suite: bool = False) -> dict:
    """One 125M run of issue 29 step 4: one pass over fresh `code` tokens at training length seq_len
    (32768 tokens a step, no gradient accumulation: 64 x 512 fits an 80 GB GPU), evaluated to 16384 on
    code's long test split; the checkpoint is deleted once the evaluation has run. A job takes one whole
    GPU ("solo": several run at once on a machine of several GPUs)."""
    name = name or f"{method}-s{seed}"
    run = f"{root}/T{seq_len}/{name}"
    sets = [f"model.method={method}", f"train.seed={seed}", f"train.steps={EPOCH_STEPS}", "train.sampling=pass",
            "train.ckpt_every=1000", "train.val_every=250", "train.val_batches=16", "data.corpus=code",
            "eval.max_length=16384", *extra]
    if seq_len != 128:  # T 128 x 256 is the preset's own: those commands stay those of the runs already made
        sets[3:3] = [f"train.seq_len={seq_len}", f"train.batch_size={EPOCH_TOKENS_PER_STEP // seq_len}"]
    if SMOKE:
        layout = any(x.startswith("model.layers=") for x in extra)  # its pattern of 4 layers must divide them
        sets += [f"model.n_layer={4 if layout else 2}", "model.d_model=96", "train.batch_size=2", "eval.windows=2",
                 f"eval.max_length={max(512, 2 * seq_len)}", "train.device=cpu"]
    cmd = train_and_eval("125m", sets, run) + (suite_commands(run, seq_len) if suite else "") + f" && rm -rf {run}/ckpt"
    # T 128's ids are those of the runs already made (results/epoch/done.txt)
    job_id = f"{experiment}/{name}" if seq_len == 128 else f"{experiment}/T{seq_len}/{name}"
    return {"id": job_id, "kind": "solo", "run": run, "cmd": cmd}


def epoch() -> list[dict]:
    """Issue 29 step 4. T 128 (batch 256): the headline methods on seed 0, then their seeds 1 and 2,
    then the one-seed methods, then the capacity control (paper section 4.6) on 2 seeds. Then T 512
    with 64 x 512 (32,768 tokens a step, as at T 128; the paper's batch is 256 x 512) on 2 seeds, then
    T 2048 (16 x 2048) on 1 seed."""
    headline = ["kerple", "dapev2-kerple", "dape-kerple", "rope", "stickbreaking"]
    jobs = [epoch_job(m, s) for s in (0, 1, 2) for m in headline]
    jobs += [epoch_job(m, 0) for m in ("alibi", "fire", "nope")]
    jobs += [epoch_job("dape-kerple", s, ("model.dape_hidden=64",), f"dape-kerple-D64-s{s}") for s in (0, 1)]
    jobs += [epoch_job("dapev2-kerple", s, (f"model.dape_hidden={D}",), f"dapev2-kerple-D{D}-s{s}")
             for D in (10, 21) for s in (0, 1)]
    jobs += [epoch_job(m, s, seq_len=512) for s in (0, 1) for m in headline]
    jobs += [epoch_job(m, 0, seq_len=2048) for m in ("stickbreaking", "rope", "kerple")]
    return jobs


# Issue 44: the T 2048 recipe. The epoch recipe (lr 6e-4, warm-up 1% = 30 steps, at 16 x 2048) trails
# its T 512 runs by 0.4-0.5 nats over steps 100-1000; each recipe here changes one thing.
# seqwarm10: the sequence length doubles 512 -> 1024 -> 2048 over the first 10% of the steps (305: 512 for
# steps 0-152, 1024 for 153-304), the same 32,768 tokens a step, each read once in the same order.
RECIPES = {"warm10": ("train.warmup_frac=0.1",), "lr3e-4": ("train.lr=3e-4",),
           "seqwarm10": ("train.seq_len_start=512", f"train.seq_len_warmup={max(2, EPOCH_STEPS // 10)}")}


def recipe() -> list[dict]:
    """Issue 44 part 2: Kerple at T 2048 (16 x 2048, the epoch runs' data and steps) with each recipe,
    seed 0 of every recipe first (a cut-off session still compares them all). Then what decides the
    recipe warm10's seed 0 favours: its seed 1 and the epoch recipe's seed 1 (its seed 0 is
    results/epoch's T2048/kerple-s0); whether warm10 holds beyond Kerple at 2048: RoPE at 2048 (the
    epoch recipe's seed 0 is results/epoch's) and Kerple at 512 (64 x 512; the epoch recipe's seeds
    0 and 1 are results/epoch's), seed 0 of both before seed 1; last the losing recipes' seed 1.
    Evaluated as the epoch runs, with the per-position loss and the synthetic suite (suite_commands)."""
    def job(method, seed, recipe_name=None, seq_len=2048):
        sets = (*RECIPES[recipe_name], "eval.per_position=true") if recipe_name else ("eval.per_position=true",)
        name = f"{method}-{recipe_name}-s{seed}" if recipe_name else f"{method}-s{seed}"
        return epoch_job(method, seed, sets, name, seq_len, "runs/recipe", "recipe", suite=True)

    jobs = [job("kerple", 0, r) for r in RECIPES] + [job("kerple", 1, "warm10"), job("kerple", 1)]
    jobs += [job("rope", s, "warm10") if T == 2048 else job("kerple", s, "warm10", 512) for s in (0, 1) for T in (2048, 512)]
    return jobs + [job("kerple", 1, r) for r in RECIPES if r != "warm10"]


# Issues 42 and 43: a first look at the newer methods (a smoke result, not the verdict) and the
# evaluation example. `small` at T 128 on `code` (2000 steps x 64 x 128 = 16.4M tokens, one pass:
# train shard 00000 only), evaluated to 8192 with the per-position loss.
NEWER_BASELINES = ["kerple", "rope", "dapev2-kerple"]
NEWER_METHODS = ["fox", "ssmax-rope", "pope", "mta", "dapev2-fox"]
SUITE_LENGTHS = "256,512,2048,8192"  # cwe needs 129 tokens or more


def newer() -> list[dict]:
    """Every method's seed 0 first (a cut-off machine still compares them all), then seeds 1 and 2.
    The baselines' seed 0 also runs the synthetic suite (RULER- and BABILong-style) at 128-8192:
    issue 43's example."""
    jobs = []
    for seed in (0, 1, 2):
        for method in NEWER_BASELINES + NEWER_METHODS:
            job = lm_job("T128", method, seed, corpus="code", root="runs/newer",
                         extra=("train.sampling=pass", "eval.per_position=true"))
            if seed == 0 and method in NEWER_BASELINES:
                lengths = "256,512" if SMOKE else SUITE_LENGTHS
                job["cmd"] += "".join(f" && python3 -m lenx eval {job['run']} --task {t} --lengths {lengths}"
                                      f" --no-progress" for t in ("ruler", "babilong"))
            jobs.append(job)
    return jobs


def ssmax_init() -> list[dict]:
    """Issue 42's check of SSMax's initialisation: ssmax-rope as `newer` ran it, with s_h = 0.43 at the
    start (the value of the paper's Fig. 1, which some reimplementations take as the paper's) on three
    seeds, and with lenx's s_h = 1 once more on seed 0 (the newer runs' learned scales were lost with
    their checkpoints). Each run prints its learned scales per layer (ssmax_scales.py) into its job log."""
    jobs = []
    for seed, init in ((0, 0.43), (1, 0.43), (2, 0.43), (0, 1.0)):
        name = f"ssmax-rope-init{int(init * 100):03d}-s{seed}"
        job = lm_job("T128", "ssmax-rope", seed, corpus="code", root="runs/ssmax_init", name=name,
                     extra=("train.sampling=pass", "eval.per_position=true", f"model.temp_ssmax_init={init}"))
        job["cmd"] += f" && python3 scripts/repro/ssmax_scales.py {job['run']}"
        jobs.append(job)
    return jobs


# Issue 44 parts 2 and 4: the newer methods and layouts at T 512 (the paper's main length), 125M, 64 x 512,
# 3 seeds, beside the five methods of the epoch verdict trained with the same recipe at T 512 and 2048
# (part 2's seeds), each scored on perplexity, the per-position loss and the synthetic suite. The costly
# runs come last in each seed's T 512 runs: MTA on its chunked path (~6x Kerple's step, results/bench/h200_issue42_8c3998e) and document-masked DAPE V2
# on the O(T) Triton kernel (~10x the skewed kernels' time, notes/kernels.md).
# The recipe is warm10 at every length: it removes the epoch recipe's handicap at T 2048 (Kerple and RoPE,
# two seeds) and at T 512 extrapolates far better at the same in-distribution perplexity
# (results/recipe/README.md, "What it shows so far"), so the five run again with it at 512 and 2048.
VERDICT_RECIPE = RECIPES["warm10"]
VERDICT_FIVE = ["rope", "kerple", "stickbreaking", "dape-kerple", "dapev2-kerple"]  # cheap first
VERDICT_RUNS = {  # name: (method, settings)
    "fox": ("fox", ()), "ssmax-rope": ("ssmax-rope", ()), "pope": ("pope", ()),
    "rnope-swa": ("rope", ("model.layers=rnope-swa",)), "rope-p0.5": ("rope", ("model.rope_fraction=0.5",)),
    "dapev2-fox": ("dapev2-fox", ()), "kerple-docmasked": ("kerple", ("train.documents=masked",)),
    "mta": ("mta", ()), "dapev2-kerple-docmasked": ("dapev2-kerple", ("train.documents=masked",)),
}
# Recipe-plan runs that are exactly a verdict2 job (the same command but for its folder): verdict2 reads
# them from the recipe results and does not run them again. T2048/kerple-warm10-s0 is not one: it ran
# before the suite was part of the job (no --task evaluations), so verdict2 runs its kerple-s0 again.
VERDICT_REUSED = {"T512/kerple-s0": "T512/kerple-warm10-s0", "T512/kerple-s1": "T512/kerple-warm10-s1",
                  "T2048/kerple-s1": "T2048/kerple-warm10-s1",
                  "T2048/rope-s0": "T2048/rope-warm10-s0", "T2048/rope-s1": "T2048/rope-warm10-s1"}


def verdict2_jobs() -> list[dict]:
    """Every verdict2 run, the reused ones too: seed-major (a cut-off session still compares every
    method), in each seed the five at T 512, the newer runs, then the five at T 2048 (16 x 2048)."""
    def job(name, method, seed, sets=(), seq_len=512):
        return epoch_job(method, seed, (*VERDICT_RECIPE, *sets, "eval.per_position=true"), f"{name}-s{seed}",
                         seq_len, "runs/verdict2", "verdict2", suite=True)

    jobs = []
    for s in (0, 1, 2):
        jobs += [job(m, m, s) for m in VERDICT_FIVE]
        jobs += [job(name, method, s, sets) for name, (method, sets) in VERDICT_RUNS.items()]
        jobs += [job(m, m, s, seq_len=2048) for m in VERDICT_FIVE]
    return jobs


def verdict2() -> list[dict]:
    """The verdict2 jobs the device runs: all but the reused recipe runs (VERDICT_REUSED)."""
    return [j for j in verdict2_jobs() if j["id"].removeprefix("verdict2/") not in VERDICT_REUSED]


def controls() -> list[dict]:
    """Issue 19: the second seeds of the 125M verdict (then its other methods), and part 2's controls
    with the `small` preset, each evaluated like run 1 of the reproduction (to 16384) so it pairs with
    the runs in results/repro."""
    def job(experiment, method, seed=0, **kw):
        return lm_job(experiment, method, seed, max_length=kw.pop("max_length", 16384), root=CONTROLS, **kw)

    jobs = [v125_job(m, s) for m, s in (("dape-kerple", 1), ("rope", 1), ("alibi", 0), ("nope", 0),
                                        ("stickbreaking", 0), ("fire", 0))]
    seeds = (0, 1, 2)
    # Capacity (paper section 4.6): DAPE with D = 64 against DAPE V2 with D = 10 and 21 (32: run 1).
    jobs += [job("capacity", "dape-kerple", s, extra=("model.dape_hidden=64",), name=f"dape-kerple-D64-s{s}")
             for s in seeds]
    jobs += [job("capacity", "dapev2-kerple", s, extra=(f"model.dape_hidden={D}",), name=f"dapev2-kerple-D{D}-s{s}")
             for D in (10, 21) for s in seeds]
    # Figure 1: DAPE on NoPE and RoPE beside DAPE V2's (run 1 has dapev2-nope, dapev2-rope).
    jobs += [job("tech-T128", m, s) for m in ("dape-nope", "dape-rope") for s in seeds]
    # Stick-breaking's remainder options at 128 (run 1 has `value`).
    jobs += [job("sb-remainder", "stickbreaking", s, extra=(f"model.sb_remainder={r}",), name=f"sb-{r}-s{s}")
             for r in ("head", "drop") for s in (0, 1)]
    jobs += [job("sb-remainder", "stickbreaking", s, extra=("model.sb_attend_current=true",),
                 name=f"sb-attend-current-s{s}") for s in (0, 1)]
    # Figure 5: DAPE on ALiBi and FIRE (run 1 has their DAPE V2 forms).
    jobs += [job("tech-T128", m) for m in ("dape-alibi", "dape-fire")]
    # Training length 512 with as many sequences per step as at 128 (4x the tokens; the paper's batch is 256);
    # the longest small jobs, listed first (DAPE's MLP first) so a session's tail is short.
    jobs += [job("tech-T512-b64", m, seq_len=512, batch_size=TOKENS_PER_STEP // 128, max_length=8192)
             for m in ("dape-kerple", "dapev2-kerple", "stickbreaking", "rope", "kerple")]
    # Kernel sizes 1, 5, 7: seeds 1 and 2.
    jobs += [job("kernel-size", "dapev2-kerple", s, extra=(f"model.dape_kernel={k}",), name=f"dapev2-kerple-k{k}-s{s}")
             for k in (1, 5, 7) for s in (1, 2)]
    # Leakage for the ALiBi and FIRE forms.
    jobs += [job("leak", m, extra=("model.dape_leak=true",), name=f"{m}-leak-s0") for m in ("dapev2-alibi", "dapev2-fire")]
    # Stick-breaking's claim: trained at 2048 with the same tokens per step, evaluated to 16384.
    jobs += [job("T2048", m, seq_len=2048) for m in ("stickbreaking", "rope", "kerple")]
    return jobs


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "repro"
    plans = {"repro": plan, "controls": controls, "epoch": epoch, "recipe": recipe,
             "newer": newer, "verdict2": verdict2, "ssmax_init": ssmax_init}
    if which not in plans:
        sys.exit(f"plan.py: the plan is one of {', '.join(plans)}, got {which!r}")
    json.dump(plans[which](), sys.stdout, indent=1)
