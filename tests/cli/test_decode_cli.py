"""`lenx generate`, `lenx eval --task` and `lenx eval --rope-scaling` as a user runs them."""

import json

import pytest

from test_cli import lenx


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny runs on the synthetic corpus (rope, kerple), trained through the CLI."""
    root = tmp_path_factory.mktemp("decode")
    for method in ("rope", "kerple"):
        out = lenx("train", "-c", "tiny", "--set", "train.steps=20", "--set", f"model.method={method}",
                   "--set", "eval.max_length=256", "-o", method, cwd=root)
        assert out.returncode == 0, out.stderr
    return root


def test_generate_streams_and_greedy_is_deterministic(runs):
    args = ["generate", "rope", "--prompt", "5 17 3 9", "--max-new-tokens", "12", "--temperature", "0"]
    a, b = lenx(*args, cwd=runs), lenx(*args, cwd=runs)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and len(a.stdout.split()) == 12
    last = a.stderr.strip().splitlines()[-1]  # the prefill's and the decoding's rates, apart
    assert "prefill" in last and "decode" in last and "tokens/s" in last and "ms/token" in last
    assert "reading the 4-token prompt" in a.stderr and "read 4 prompt tokens in" in a.stderr
    sampled = lenx("generate", "rope", "--prompt", "5 17 3 9", "--max-new-tokens", "12", "--seed", "1", cwd=runs)
    assert sampled.returncode == 0 and len(sampled.stdout.split()) == 12


@pytest.mark.parametrize("args,words", [
    (["generate", "rope", "--prompt", "   "], "empty"),
    (["generate", "rope", "--prompt", "1 2 3", "--max-context", "8", "--max-new-tokens", "6"], "cache limit"),
    (["generate", "rope", "--prompt", "hello"], "token ids"),
    (["generate", "nowhere", "--prompt", "1 2"], "not a lenx run"),
    (["generate", "rope"], "--prompt"),
    (["generate", "rope", "--prompt", "1", "--top-p", "0"], "top-p"),
    (["generate", "rope", "--prompt", "1", "--prompts-file", "rope/config.toml"], "one of them"),
    (["generate", "rope", "--prompts-file", "nowhere.txt"], "not a file"),
    (["generate", "rope", "--prompt", "1", "--stop-id", "99999"], "vocabulary"),
    (["generate", "rope", "--prompt", "1", "--stop", ""], "--stop"),
    (["generate", "rope", "--prompt", "1", "--stop", "hello"], "--stop 'hello': corpus 'synthetic' is token-level"),
    (["generate", "rope", "--prompt", "1", "--prompt", "x"], "token ids"),
    (["generate", "rope", "--prompt", "1", "--cuda-graph", "--device", "cpu"], "CUDA"),
    (["eval", "rope", "--task", "haystack"], "--task"),
    (["eval", "kerple", "--rope-scaling", "yarn"], "RoPE"),
    (["eval", "rope", "--rope-scaling", "longrope"], "model.rope_scaling"),
    (["eval", "rope", "--rope-scaling", "pi", "--rope-scaling-factor", "0.5"], "factor"),
    (["eval", "rope", "--task", "copy", "--depths", "0,2"], "depths"),
    (["eval", "rope", "--depths", "0.5"], "--task"),
    # the backend judged on the device the evaluation runs on, not on CUDA
    (["eval", "rope", "--backend", "triton", "--device", "cpu"], "model.backend=triton (model.method=rope) on cpu: "),
])
def test_bad_input_is_one_line(runs, args, words):
    out = lenx(*args, cwd=runs)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert words in lines[0], lines[0]


def test_generate_without_a_checkpoint(runs):
    (runs / "empty").mkdir()
    (runs / "empty" / "config.toml").write_text((runs / "rope" / "config.toml").read_text())
    out = lenx("generate", "empty", "--prompt", "1 2", cwd=runs)
    assert out.returncode == 2 and "no checkpoint" in out.stderr


def test_eval_copy_task_and_rope_scaling(runs):
    out = lenx("eval", "rope", "--task", "copy", "--lengths", "64,128", "--depths", "0,1", "--samples", "2",
               cwd=runs)
    assert out.returncode == 0, out.stderr
    res = json.loads((runs / "rope" / "eval_copy.json").read_text())
    assert res["task"] == "copy" and len(res["accuracy"]) == 2 and len(res["accuracy"][0]) == 2
    assert res["lengths"] == [64, 128] and res["finished"] is True
    out = lenx("eval", "rope", "--rope-scaling", "yarn", "--lengths", "64,128,256", "--windows", "4", cwd=runs)
    assert out.returncode == 0, out.stderr
    scaled = json.loads((runs / "rope" / "eval_rope-yarn.json").read_text())
    assert scaled["label"] == "rope+yarn" and scaled["rope_scaling"]["factor"] == "auto"
    assert [line.split()[1] for line in out.stdout.splitlines() if line.startswith("│")] == ["rope+yarn"]
    assert scaled["rope_scaling"]["train_len"] == 64
    plain = lenx("eval", "rope", "--lengths", "64,128,256", "--windows", "4", cwd=runs)
    assert plain.returncode == 0, plain.stderr
    base = json.loads((runs / "rope" / "eval.json").read_text())
    # auto: the identity at the training length, a different model beyond it
    assert scaled["results"]["64"]["ppl"] == base["results"]["64"]["ppl"]
    assert scaled["results"]["256"]["ppl"] != base["results"]["256"]["ppl"]


def test_the_token_level_hint_is_a_prompt_that_works(runs):
    """The error for a text prompt on a token-level corpus suggests ids; the suggestion itself runs."""
    out = lenx("generate", "rope", "--prompt", "hello", cwd=runs)
    example = out.stderr.split("--prompt '")[1].split("'")[0]
    again = lenx("generate", "rope", "--prompt", example, "--max-new-tokens", "2", "--temperature", "0", cwd=runs)
    assert again.returncode == 0, again.stderr


def continuation(runs, *args):
    out = lenx("generate", "rope", *args, "--temperature", "0", "--json", cwd=runs)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_several_prompts_are_continued_as_each_alone(runs):
    prompts = ["5 17 3 9", "8", "1 2 3 4 5 6 7 8 9 10 11"]
    alone = [continuation(runs, "--prompt", p, "--max-new-tokens", "6") for p in prompts]
    assert all(a["new_tokens"] == a["outputs"][0]["new_tokens"] for a in alone)  # one prompt: its keys at the top
    together = continuation(runs, *[x for p in prompts for x in ("--prompt", p)], "--max-new-tokens", "6")
    assert [o["new_tokens"] for o in together["outputs"]] == [a["new_tokens"] for a in alone]
    assert [o["prompt_tokens"] for o in together["outputs"]] == [4, 1, 11] and "new_tokens" not in together
    assert together["prefill_tokens_per_s"] > 0 and together["decode_steps"] == 5
    (runs / "prompts.txt").write_text("\n".join(prompts[:2]) + "\n\n" + prompts[2] + "\n")
    from_file = continuation(runs, "--prompts-file", "prompts.txt", "--max-new-tokens", "6")
    assert from_file["outputs"] == together["outputs"]
    text = lenx("generate", "rope", "--prompts-file", "prompts.txt", "--max-new-tokens", "6", "--temperature", "0",
                cwd=runs)
    assert text.returncode == 0, text.stderr
    assert text.stdout.count("=== ") == 3 and "=== 2/3: 1 prompt tokens, 6 new, ended at length" in text.stdout
    assert " ".join(map(str, alone[1]["new_tokens"])) in text.stdout


def test_stops_end_each_continuation(runs):
    prompts = ["5 17 3 9", "8"]
    free = continuation(runs, "--prompt", prompts[0], "--prompt", prompts[1], "--max-new-tokens", "8")["outputs"]
    first = free[0]["new_tokens"]
    at = first.index(first[2]) + 1  # where a stop at its third token ends it
    out = continuation(runs, "--prompt", prompts[0], "--prompt", prompts[1], "--max-new-tokens", "8",
                       "--stop-id", str(first[2]))["outputs"]
    assert out[0]["new_tokens"] == first[:at] and out[0]["stop"] == first[2]
    assert out[0]["text"] == " ".join(map(str, first[:at - 1]))  # the stop left out of the text
    # a stop string on a token-level corpus: token ids, matched as the continuation's last tokens
    pair = f"{first[3]} {first[4]}"
    end = next(i for i in range(2, 6) if first[i - 2:i] == first[3:5])  # the pair's first appearance ends it
    one = continuation(runs, "--prompt", prompts[0], "--max-new-tokens", "8", "--stop", pair)
    assert one["stop"] == pair and one["new_tokens"] == first[:end]
    assert one["text"] == " ".join(map(str, first[:end - 2]))
    streamed = lenx("generate", "rope", "--prompt", prompts[0], "--max-new-tokens", "8", "--stop", pair,
                    "--temperature", "0", cwd=runs)
    assert streamed.returncode == 0 and streamed.stdout.split() == [str(t) for t in first[:end - 2]], streamed.stdout


def one_line_error(out) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


def test_prompt_files_that_are_not_utf8_are_one_line(runs):
    (runs / "bad8.txt").write_bytes(b"1 2\xff\xfe\n")
    for option in ("--prompts-file", "--prompt-from-file"):
        line = one_line_error(lenx("generate", "rope", option, "bad8.txt", cwd=runs))
        assert line == f"error: {option} bad8.txt is not UTF-8 (byte 0xff at 3)"


def test_the_old_prompt_file_name_says_which_option_to_use(runs):
    (runs / "one.txt").write_text("5 17\n3 9\n")
    line = one_line_error(lenx("generate", "rope", "--prompt-file", "one.txt", cwd=runs))
    assert "--prompt-from-file" in line and "--prompts-file" in line
    # --prompt-from-file: the whole file (both lines) is one prompt
    out = continuation(runs, "--prompt-from-file", "one.txt", "--max-new-tokens", "2")
    assert len(out["outputs"]) == 1 and out["prompt_tokens"] == 4 and out["prompt"] == "5 17\n3 9\n"
    help_text = lenx("generate", "--help", columns=200).stdout
    assert "--prompt-from-file" in help_text and "ONE prompt" in help_text and "SEVERAL prompts" in help_text
    assert "--prompt-file " not in help_text  # the old name is hidden


def test_json_output_names_each_prompt(runs):
    out = continuation(runs, "--prompt", "5 17 3 9", "--prompt", "8", "--max-new-tokens", "2")
    assert [o["prompt"] for o in out["outputs"]] == ["5 17 3 9", "8"]


def test_a_bad_backend_is_the_error_eval_gives(runs):
    for backend in ("nosuch", "triton"):
        generate = one_line_error(lenx("generate", "rope", "--prompt", "1 2", "--backend", backend, "--device", "cpu",
                                       cwd=runs))
        evaluate = one_line_error(lenx("eval", "rope", "--backend", backend, "--device", "cpu", cwd=runs))
        assert generate == evaluate and "model.backend" in generate
    from lenx.attention.backends import BACKENDS
    from lenx.cli.evaluate import BACKEND_CHOICES

    assert BACKEND_CHOICES == ", ".join(("auto", *BACKENDS[:-1])) + f" or {BACKENDS[-1]}"
    for command in ("generate", "eval"):
        assert BACKEND_CHOICES in " ".join(lenx(command, "--help", columns=300).stdout.split())


def test_a_cache_that_cannot_fit_is_refused_before_loading(runs):
    line = one_line_error(lenx("generate", "rope", "--prompt", "1 2", "--max-new-tokens", "100000000",
                               "--max-context", "200000000", "--device", "cpu", cwd=runs))
    assert "the KV cache of 100,000,002 slots" in line and "GB available; lower --max-new-tokens" in line
    assert "--no-memory-check" in line


def test_options_are_checked_before_the_run_is_read():
    # no run folder at all: the option's own error, not the run's
    line = one_line_error(lenx("generate", "nowhere", "--prompt", "1", "--top-k", "-1"))
    assert "--top-k must be >= 0" in line


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("extra", [["--json"], [], ["--prompt", "8"]])
def test_a_full_stdout_is_one_line(runs, extra):
    import subprocess
    import sys

    from test_cli import SRC

    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "-m", "lenx", "generate", "rope", "--prompt", "5 17", "--max-new-tokens",
                              "2", *extra], stdout=full, stderr=subprocess.PIPE, text=True, timeout=600, cwd=runs,
                             env={**__import__("os").environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 2 and "Traceback" not in out.stderr and "Exception ignored" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == "error: cannot write the output to stdout: No space left on device"
