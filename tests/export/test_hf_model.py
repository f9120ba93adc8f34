"""An exported folder under transformers: AutoModelForCausalLM gives lenx's logits for every method
family, greedy generate() gives lenx's own generate()'s tokens, alone and in a batch of left-padded
prompts, and what lenx cannot do (a mask with holes, right-padded prompts to generate from, an
unknown setting, a missing lenx) is a one-line error."""

import importlib.util
import sys

import pytest
import torch

from export_helpers import load, write_model
from helpers import V, model_for
from lenx.model.generate import generate

pytest.importorskip("transformers")

# every family: each base alone, DAPE, DAPE V2 on each base, stick-breaking alone and under DAPE V2
FAMILIES = ["rope", "alibi", "kerple", "kerple-power", "t5", "fire", "cope", "xl", "nope", "dape-kerple", "stickbreaking",
            "dapev2-nope", "dapev2-rope", "dapev2-alibi", "dapev2-kerple", "dapev2-kerple-power", "dapev2-fire",
            "dapev2-t5", "dapev2-xl", "dapev2-stickbreaking"]


def lenx_model(method, **overrides):
    return model_for(method, **overrides).float()


@pytest.mark.parametrize("method", FAMILIES)
def test_logits_and_greedy_generation_are_lenx_s(method, tmp_path):
    lm = lenx_model(method)
    hf = load(write_model(lm, tmp_path / method))
    idx = torch.randint(0, V, (2, 19))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, lm(idx)[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(hf(idx[:1, :1]).logits, lm(idx[:1, :1])[0], atol=1e-5, rtol=0)
    for prompt in (idx[:1, :7], idx[:, :5]):  # one sequence, and a batch of two
        want = generate(lm, prompt, 12, temperature=0)["tokens"]
        got = hf.generate(prompt, max_new_tokens=12, do_sample=False)
        assert torch.equal(got[:, prompt.shape[1]:], want), method


def test_generation_without_a_cache_and_with_beams_agree(tmp_path):
    """use_cache=False runs full forwards; beam search reorders the cache (LenxCache.reorder_cache)."""
    lm = lenx_model("dapev2-kerple")
    hf = load(write_model(lm, tmp_path / "m"))
    prompt = torch.randint(0, V, (1, 6))
    assert torch.equal(hf.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=False),
                       hf.generate(prompt, max_new_tokens=8, do_sample=False))
    beams = [hf.generate(prompt, max_new_tokens=8, do_sample=False, num_beams=3, use_cache=c) for c in (True, False)]
    assert torch.equal(beams[0], beams[1])


def test_eos_stops_generation(tmp_path):
    lm = lenx_model("kerple")
    prompt = torch.randint(0, V, (1, 5))
    want = generate(lm, prompt, 10, temperature=0)["tokens"][0].tolist()
    eos = want[3]  # the 4th new token, as if it were the end of text
    hf = load(write_model(lm, tmp_path / "m", eos_id=eos))
    got = hf.generate(prompt, max_new_tokens=10, do_sample=False)[0, 5:].tolist()
    assert got == want[:want.index(eos) + 1]


@pytest.mark.parametrize("method", ["rope", "dapev2-kerple"])
def test_the_cache_grows_and_extends_by_any_number_of_tokens(method, tmp_path):
    """A cache made for 8 tokens takes 30 in pieces of 5, 1 and 24; every step's logits are those of a
    full forward (DAPE V2 recomputes its last rows)."""
    from lenx.export.hf import LenxCache

    lm = lenx_model(method)
    hf = load(write_model(lm, tmp_path / "m"))
    idx = torch.randint(0, V, (2, 30))
    cache, out = LenxCache(8), []
    with torch.no_grad():
        for a, b in ((0, 5), (5, 6), (6, 30)):
            step = hf(idx[:, a:b], cache=cache, use_cache=True)
            assert step.logits.shape == (2, b - a, V)
            out.append(step.logits[:, -1])
            torch.testing.assert_close(step.logits[:, -1], lm(idx[:, :b])[0][:, -1], atol=1e-5, rtol=0)
    assert cache.length == 30 and cache.capacity >= 30


def test_padding_on_either_side_gives_each_row_alone_and_other_masks_are_refused(tmp_path):
    lm = lenx_model("dapev2-kerple")  # its last rows depend on the keys after them
    hf = load(write_model(lm, tmp_path / "m"))
    idx = torch.randint(0, V, (3, 12))
    right = torch.ones(3, 12, dtype=torch.long)
    right[1, 7:] = 0
    right[2, 1:] = 0
    with torch.no_grad():
        logits = hf(idx, attention_mask=right).logits
        for b, n in enumerate((12, 7, 1)):
            torch.testing.assert_close(logits[b, :n], lm(idx[b:b + 1, :n])[0][0], atol=1e-5, rtol=0)
        left = right.flip(1)
        logits = hf(idx, attention_mask=left).logits
        for b, n in enumerate((12, 7, 1)):
            torch.testing.assert_close(logits[b, 12 - n:], lm(idx[b:b + 1, 12 - n:])[0][0], atol=1e-5, rtol=0)
        holes = torch.ones(3, 12, dtype=torch.long)
        holes[0, 4] = 0
        with pytest.raises(ValueError, match="padding on one side of a batch only"):
            hf(idx, attention_mask=holes)
    with pytest.raises(ValueError, match="generate from left-padded prompts"):
        hf.generate(idx, attention_mask=right, max_new_tokens=2, do_sample=False)
    with pytest.raises(ValueError, match="every prompt needs a token"):
        hf.generate(idx, attention_mask=torch.zeros(3, 12, dtype=torch.long), max_new_tokens=2, do_sample=False)


def left_padded(prompts, pad: int = 3):
    """A left-padded batch of `prompts` (1-D) and its attention_mask, the padding a real token."""
    T = max(len(p) for p in prompts)
    idx, mask = torch.full((len(prompts), T), pad), torch.zeros(len(prompts), T, dtype=torch.long)
    for b, p in enumerate(prompts):
        idx[b, T - len(p):], mask[b, T - len(p):] = p, 1
    return idx, mask


@pytest.mark.parametrize("method", ["rope", "kerple", "dapev2-kerple", "stickbreaking"])
def test_left_padded_prompts_generate_each_row_as_alone(method, tmp_path):
    """generate() of a batch of prompts of different lengths (attention_mask zeros on the left) gives
    every row the greedy tokens of its prompt alone, and lenx's own; so does generation without a
    cache (full forwards of left-padded rows)."""
    lm = lenx_model(method)
    hf = load(write_model(lm, tmp_path / method))
    prompts = [torch.randint(0, V, (n,)) for n in (7, 1, 11, 4)]
    idx, mask = left_padded(prompts)
    cached = hf.generate(idx, attention_mask=mask, max_new_tokens=10, do_sample=False)[:, idx.shape[1]:]
    uncached = hf.generate(idx, attention_mask=mask, max_new_tokens=10, do_sample=False, use_cache=False)
    for b, p in enumerate(prompts):
        alone = hf.generate(p[None], max_new_tokens=10, do_sample=False)[0, len(p):]
        assert torch.equal(alone, generate(lm, p[None], 10, temperature=0)["tokens"][0]), (method, b)
        assert torch.equal(cached[b], alone), (method, b)
        assert torch.equal(uncached[b, idx.shape[1]:], alone), (method, b)


def test_left_padded_beams_and_a_growing_cache_keep_each_row_s_positions(tmp_path):
    """Beam search over left-padded prompts gives each prompt's beams alone; a cache made too small
    grows and keeps each sequence's padding (its start slot); a mask that does not continue the
    prompts' padding is refused."""
    from lenx.export.hf import LenxCache

    lm = lenx_model("dapev2-kerple")
    hf = load(write_model(lm, tmp_path / "m"))
    prompts = [torch.randint(0, V, (n,)) for n in (6, 2)]
    idx, mask = left_padded(prompts)
    beams = hf.generate(idx, attention_mask=mask, max_new_tokens=6, do_sample=False, num_beams=3)[:, idx.shape[1]:]
    for b, p in enumerate(prompts):
        assert torch.equal(beams[b], hf.generate(p[None], max_new_tokens=6, do_sample=False, num_beams=3)[0, len(p):])
    cache, tokens = LenxCache(4), idx
    with torch.no_grad():
        for step in range(5):  # 6 slots of prompt, then one token per step: the cache grows at the second
            full = torch.cat([mask, torch.ones(2, step, dtype=torch.long)], 1)
            out = hf(tokens if step == 0 else tokens[:, -1:], attention_mask=full, cache=cache, use_cache=True)
            for b, p in enumerate(prompts):
                alone = torch.cat([p, tokens[b, idx.shape[1]:]])
                torch.testing.assert_close(out.logits[b, -1], lm(alone[None])[0][0, -1], atol=1e-5, rtol=0)
            tokens = torch.cat([tokens, out.logits[:, -1].argmax(-1, keepdim=True)], 1)
        assert cache.capacity >= 11 and cache.kv.start.tolist() == [0, 4]
        with pytest.raises(ValueError, match="the prompts' left padding, then ones"):
            hf(tokens[:, -1:], attention_mask=torch.ones(2, tokens.shape[1], dtype=torch.long), cache=cache)


def test_labels_give_the_next_token_loss_and_other_inputs_are_refused(tmp_path):
    lm = lenx_model("alibi")
    hf = load(write_model(lm, tmp_path / "m"))
    idx = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        loss = hf(idx, labels=idx).loss
        assert torch.allclose(loss, lm(idx[:, :-1], idx[:, 1:])[1], atol=1e-6)
        with pytest.raises(ValueError, match="lenx models take no position_ids"):
            hf(idx, position_ids=torch.arange(10)[None])
        with pytest.raises(ValueError, match="take no output_hidden_states"):
            hf.generate(idx[:1], max_new_tokens=2, output_hidden_states=True, return_dict_in_generate=True)
        with pytest.raises(ValueError, match="not inputs_embeds"):
            hf(inputs_embeds=torch.zeros(1, 3, 16))
        assert hf(idx, output_hidden_states=False, return_dict=False)[0].shape == (2, 10, V)


def test_settings_this_lenx_does_not_know_are_named(tmp_path):
    from lenx.export.hf import LenxConfig

    config = LenxConfig(lenx={"method": "rope", "rope_warp": 2.0}, lenx_version="9.0")
    with pytest.raises(ValueError, match=r"lenx 9\.0 .*\(rope_warp\): pip install -U lenx"):
        config.lm_config()


def test_a_missing_or_older_lenx_names_pip_install(tmp_path, monkeypatch):
    from transformers import AutoConfig

    import lenx
    from lenx.export.hf import require_lenx

    with pytest.raises(ImportError, match=r"exported by lenx 99\.0 and lenx .* installed: pip install -U 'lenx\[hf\]>=99\.0'"):
        require_lenx("99.0")
    folder = write_model(lenx_model("rope"), tmp_path / "no_lenx_here")
    monkeypatch.setitem(sys.modules, "lenx.export.hf", None)  # as if lenx (or this part of it) were not installed
    with pytest.raises(ImportError, match=rf"this model's code is lenx's: pip install 'lenx\[hf\]>={lenx.__version__}'"):
        AutoConfig.from_pretrained(folder, trust_remote_code=True)


def test_a_weights_file_that_lacks_weights_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = write_model(lenx_model("t5"), tmp_path / "m")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.blocks.0.mlp.fc.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks 1 weights .*mlp\.fc\.weight.*lenx export"):
        load(folder)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["rope", "kerple", "t5", "dapev2-kerple", "stickbreaking"])
def test_on_a_gpu_the_folder_runs_lenx_s_backends(method, tmp_path):
    """Moved to the GPU, or loaded onto it (device_map), the folder gives lenx's logits with the
    backends lenx picks there (fused kernels), in fp32 and under bf16 autocast, and generate()'s
    every step is the last row of lenx's forward over the tokens so far."""
    lm = lenx_model(method)
    folder = write_model(lm, tmp_path / method)
    lm = lm.cuda()
    idx = torch.randint(0, V, (2, 300), device="cuda")
    loaded = [load(folder).cuda()]
    if importlib.util.find_spec("accelerate"):  # what transformers may need for device_map
        loaded.append(load(folder, device_map="cuda"))
    for hf in loaded:
        with torch.no_grad():
            torch.testing.assert_close(hf(idx).logits, lm(idx)[0], atol=1e-4, rtol=0)
            with torch.autocast("cuda", torch.bfloat16):
                torch.testing.assert_close(hf(idx).logits.float(), lm(idx)[0].float(), atol=1e-2, rtol=0)
        prompt = idx[:1, :50]
        out = hf.generate(prompt, max_new_tokens=20, do_sample=False, output_logits=True, return_dict_in_generate=True)
        with torch.no_grad():
            for i, logits in enumerate(out.logits):
                want = lm(out.sequences[:, :50 + i])[0][:, -1]
                torch.testing.assert_close(logits, want, atol=1e-3, rtol=0)
