"""Decoding speed per method (`lenx bench --decode`): ms per token and tokens/s of one decode step of
the --preset model (random weights) at each context length and batch size, eager (LM.decode) and
as one CUDA graph (model.decoding.StaticDecoder), beside transformers' GPT2LMHeadModel of the same
shape timed in the same run (eager with its growing cache, and its static cache compiled with
torch.compile(mode="reduce-overhead"), as transformers recommends for fast decoding).

Each row times the step alone: the cache already holds `context` tokens (for lenx, random keys and
values written straight into it: a step's cost does not depend on them; GPT-2 reads a random
prompt), then `warmup` steps, then `repeats` runs of `steps` steps, each feeding its argmax back on
the device with no host sync (CUDA events on a GPU); a row's ms/token is the median run's.
lenx runs under bf16 autocast on CUDA (fp32 on a CPU), GPT-2 in bf16 (fp32 on a CPU). A row that
runs out of memory is recorded as skipped, one that fails as an error; the others still run.

Library use: decode_bench(...) -> dict (also written as JSON); its table: lenx.report.bench_tables.
"""

from dataclasses import replace
import gc
import inspect
import statistics
import time

import torch

from .common import is_oom, write_result

DECODE_METHODS = ("rope", "kerple", "dapev2-kerple", "stickbreaking")
CONTEXTS = (1024, 8192, 32768)
BATCHES = (1, 8)
LENX_MODES = {"cuda": ("eager", "graph"), "cpu": ("eager", "static")}
GPT2_MODES = {"cuda": ("eager", "compile"), "cpu": ("eager", "static")}
GPT2 = "gpt2 (transformers)"  # the method name of transformers' rows


def _time_steps(step, token, device, warmup: int, steps: int, repeats: int) -> list[float]:
    """ms per step of `repeats` runs of `steps` steps, after `warmup` (step: token [B] -> next token [B])."""
    for _ in range(warmup):
        token = step(token)
    runs = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                token = step(token)
            end.record()
            torch.cuda.synchronize(device)
            runs.append(start.elapsed_time(end) / steps)
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                token = step(token)
            runs.append(1000 * (time.perf_counter() - t0) / steps)
    return runs


def _lenx_step(model, mode: str, context: int, batch: int, room: int, device, vocab: int):
    """A decode step of `model` from a cache of `context` random tokens, keys and values."""
    from ..model.decoding import StaticDecoder

    dtype = torch.bfloat16 if device.type == "cuda" else None
    cache = model.new_cache(batch, context + room, device, dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    cache.tokens[:, :context] = torch.randint(0, vocab, (batch, context), device=device, generator=gen)
    for layer in cache.layers:
        layer.k[:, :, :context].normal_(generator=gen)
        layer.v[:, :, :context].normal_(generator=gen)
        if layer.q is not None:  # MTA's cached queries
            layer.q[:, :, :context].normal_(generator=gen)
    cache.length = context
    if mode == "eager":
        def step(token):
            with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                return model.decode(token[:, None], cache)[:, -1].argmax(-1)
        return step
    decoder = StaticDecoder(model, cache, mode, dtype)
    return lambda token: decoder(token).argmax(-1)


def _gpt2_step(model, mode: str, context: int, batch: int, room: int, device, vocab: int):
    """A decode step of transformers' GPT-2 after a prompt of `context` random tokens (step.forward: the
    step's logits [B, vocab] before the argmax)."""
    import transformers
    from transformers import DynamicCache, StaticCache

    cache = DynamicCache(config=model.config) if mode == "eager" else StaticCache(config=model.config,
                                                                                max_cache_len=context + room)
    # transformers 5.17 names the argument past_key_values, 5.24 cache; a name the model does not take
    # lands in **kwargs unread, and GPT-2 then decodes every token with no context at all
    name = "cache" if "cache" in inspect.signature(model.transformer.forward).parameters else "past_key_values"
    prompt = torch.randint(0, vocab, (batch, context), device=device,
                           generator=torch.Generator(device=device).manual_seed(0))
    with torch.no_grad():
        model.transformer(prompt, use_cache=True, **{name: cache})  # the prefill: no logits over the prompt
    if int(cache.get_seq_length()) != context:
        raise RuntimeError(f"transformers {transformers.__version__}: GPT-2 did not fill its cache in the prefill "
                           f"({int(cache.get_seq_length())} of {context} tokens): its rows would time a step without context")

    def forward(token):
        return model(token[:, None], use_cache=True, **{name: cache}).logits[:, -1]

    if mode == "compile":
        forward = torch.compile(forward, mode="reduce-overhead")

    def step(token):
        with torch.no_grad():
            return forward(token).argmax(-1)  # outside the graph, as lenx's: a new tensor, not its output buffer
    step.forward = forward
    return step


def _gpt2(model_cfg, max_positions: int, device):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=model_cfg.vocab_size, n_positions=max_positions, n_embd=model_cfg.d_model,
                     n_layer=model_cfg.n_layer, n_head=model_cfg.n_head, n_inner=model_cfg.mlp_ratio * model_cfg.d_model,
                     activation_function="gelu")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).eval()
    return model.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)


def _row(kind, method, mode, context, batch, make_step, device, warmup, steps, repeats) -> dict:
    row = {"model": kind, "method": method, "mode": mode, "context": context, "batch": batch}
    t0 = time.time()
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        step = make_step()
        token = torch.zeros(batch, dtype=torch.long, device=device)
        runs = _time_steps(step, token, device, warmup, steps, repeats)
        ms = statistics.median(runs)
        row.update(status="ok", ms_per_token=ms, tokens_per_s=1000 * batch / ms, ms_runs=runs,
                   peak_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None)
    except Exception as err:  # noqa: BLE001  (a row that fails is a result; the others still run)
        first = str(err).splitlines()[0][:300] if str(err) else ""
        row["status"] = ("skipped: out of memory" if is_oom(err) else "error") + f" ({type(err).__name__}: {first})"
    row["wall_s"] = round(time.time() - t0, 2)
    # the step's tensors (and a failed one's traceback) are gone: free them before the next row
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def decode_bench(methods=DECODE_METHODS, contexts=CONTEXTS, batches=BATCHES, preset: str = "125m", modes=None,
                 gpt2_modes=None, vocab_size: int = 16384, steps: int = 32, warmup: int = 4, repeats: int = 3,
                 device: str = "cuda", overrides: list[str] | None = None, commit: str | None = None,
                 command: str | None = None, out_path=None, log=print) -> dict:
    """Time the decode step per method, context, batch size and mode (see the module docstring) ->
    result dict, written as JSON to out_path after every row. modes: lenx's (eager, static, graph,
    compile; default eager and graph on CUDA, eager and static on a CPU); gpt2_modes: GPT-2's
    (eager, static, compile; default eager and compile on CUDA, eager and static on a CPU; empty:
    no GPT-2 rows). Each row: model, method, mode, context, batch, status, ms_per_token,
    tokens_per_s, ms_runs, peak_gib, and x_gpt2 (its ms/token over GPT-2's compiled or static one at
    the same context and batch)."""
    from ..attention.methods import parse_method
    from ..config import ConfigError, load_config
    from ..model import LM, check_config
    from ..runinfo import environment

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda, but no CUDA device is visible (--device cpu times the same code on the CPU)")
    modes = tuple(LENX_MODES[dev.type] if modes is None else modes)
    gpt2_modes = tuple(GPT2_MODES[dev.type] if gpt2_modes is None else gpt2_modes)
    for mode in modes:
        if mode not in ("eager", "static", "graph", "compile"):
            raise ConfigError(f"--modes: {mode!r} is not one of eager, static, graph, compile")
        if mode == "graph" and dev.type != "cuda":
            raise ConfigError("--modes graph needs a CUDA device (the same step without a graph: static)")
    for mode in gpt2_modes:
        if mode not in ("eager", "static", "compile"):
            raise ConfigError(f"--gpt2-modes: {mode!r} is not one of eager, static, compile")
    if gpt2_modes:
        try:
            import transformers
        except ImportError:
            raise ConfigError("the GPT-2 rows need transformers (pip install 'lenx[hf]'), or --gpt2-modes none") from None
        if int(transformers.__version__.split(".")[0]) < 5:  # its caches' API: cache=, StaticCache(config=...)
            raise ConfigError(f"the GPT-2 rows need transformers >= 5, not {transformers.__version__} "
                              "(or --gpt2-modes none)")
    for method in methods:  # a typo is an error now, not a row after minutes
        parse_method(method)
    cfg = load_config(preset, overrides or [])
    check_config(cfg)
    base = replace(cfg.model, vocab_size=vocab_size)
    room = warmup + steps * repeats + 2  # slots past the context that the timed steps fill
    env = environment(dev)
    result = {
        "benchmark": "decode",
        "device": env.get("gpu") or f"cpu ({env.get('cpu')})",
        "torch": env["torch"], "triton": env["triton"], "cuda": torch.version.cuda, "python": env["python"],
        "transformers": transformers.__version__ if gpt2_modes else None,
        "git_commit": commit or env["git_commit"],
        "command": command if command is not None else env["command"],
        "settings": dict(methods=list(methods), contexts=list(contexts), batches=list(batches), preset=preset,
                         modes=list(modes), gpt2_modes=list(gpt2_modes), vocab_size=vocab_size, steps=steps,
                         warmup=warmup, repeats=repeats, device=device, overrides=list(overrides or []),
                         precision="bf16 autocast (GPT-2: bf16 weights)" if dev.type == "cuda" else "fp32",
                         model={k: v for k, v in vars(base).items() if k != "method"}),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": [],
    }

    def record(row):
        result["rows"].append(row)
        _add_gpt2_ratios(result)
        if log:
            log(_decode_line(row))
        if out_path:
            write_result(out_path, result)

    grid = [(context, batch) for context in contexts for batch in batches]
    if gpt2_modes:
        gpt2 = _gpt2(base, max(contexts) + room, dev)
        for context, batch in grid:
            for mode in gpt2_modes:
                record(_row(GPT2, GPT2, mode, context, batch,
                            lambda: _gpt2_step(gpt2, mode, context, batch, room, dev, vocab_size),
                            dev, warmup, steps, repeats))
        del gpt2
    for method in methods:
        torch.manual_seed(0)
        model = LM(replace(base, method=method)).to(dev).eval()
        for context, batch in grid:
            for mode in modes:
                record(_row("lenx", method, mode, context, batch,
                            lambda: _lenx_step(model, mode, context, batch, room, dev, vocab_size),
                            dev, warmup, steps, repeats))
        del model
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if out_path:
        write_result(out_path, result)
    return result


def _add_gpt2_ratios(result) -> None:
    """x_gpt2: a row's ms/token over GPT-2's fastest measured graph-backed mode (compile, else static)
    at the same context and batch; None without one."""
    ref = {}
    for mode in ("static", "compile"):  # compile wins where both ran
        for r in result["rows"]:
            if r["model"] != "lenx" and r["mode"] == mode and r["status"] == "ok":
                ref[(r["context"], r["batch"])] = (mode, r["ms_per_token"])
    for r in result["rows"]:
        mode, ms = ref.get((r["context"], r["batch"]), (None, None))
        r["x_gpt2"] = r["ms_per_token"] / ms if ms and r["status"] == "ok" else None
        r["gpt2_reference"] = mode


def _decode_line(r) -> str:
    head = f"{r['method']:>20} {r['mode']:>8} T={r['context']:>6} B={r['batch']:>3}"
    if r["status"] != "ok":
        return f"{head}  {r['status']}"
    return f"{head}  {r['ms_per_token']:8.3f} ms/token  {r['tokens_per_s']:9.1f} tokens/s"
