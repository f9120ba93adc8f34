"""Generation: greedy is the argmax of the full forward at every step, sampling is seeded."""

import pytest
import torch

from helpers import V, model_for
from lenx.config import ConfigError
from lenx.model.generate import generate, sample_next


@pytest.mark.parametrize("method", ["rope", "dapev2-kerple", "stickbreaking"])
def test_greedy_is_the_argmax_of_the_full_forward(method):
    model = model_for(method)
    prompt = torch.randint(0, V, (2, 7))
    out = generate(model, prompt, 12, temperature=0)["tokens"]
    seq = prompt
    with torch.no_grad():
        for _ in range(12):
            seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq[:, 7:])


def test_sampling_is_seeded_and_its_filters_work():
    model = model_for("kerple")
    prompt = torch.randint(0, V, (1, 5))
    a = generate(model, prompt, 20, temperature=1.0, seed=3)["tokens"]
    b = generate(model, prompt, 20, temperature=1.0, seed=3)["tokens"]
    c = generate(model, prompt, 20, temperature=1.0, seed=4)["tokens"]
    assert torch.equal(a, b) and not torch.equal(a, c)
    greedy = generate(model, prompt, 20, temperature=0)["tokens"]
    assert torch.equal(generate(model, prompt, 20, top_k=1, seed=5)["tokens"], greedy)
    assert torch.equal(generate(model, prompt, 20, top_p=1e-6, seed=5)["tokens"], greedy)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    draws = {int(sample_next(logits, 1.0, 0, 0.7, g)) for _ in range(300)}
    assert draws == {0, 1}  # 0.5 < 0.7 <= 0.5 + 0.3


@pytest.mark.parametrize("kw,match", [({"max_new_tokens": 0}, "max-new-tokens"), ({"temperature": -1}, "temperature"),
                                      ({"top_k": -2}, "top-k"), ({"top_p": 0}, "top-p")])
def test_bad_settings_are_one_line_errors(kw, match):
    args = {"max_new_tokens": 3} | kw
    with pytest.raises(ConfigError, match=match):
        generate(model_for("rope"), torch.zeros(1, 2, dtype=torch.long), args.pop("max_new_tokens"), **args)


class Letters:
    """A text corpus whose token i is the letter chr(97 + i)."""

    vocab_size, name = 26, "letters"

    def tokenizer(self):
        return object()

    def encode(self, text):
        return [ord(c) - 97 for c in text]

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


def test_stop_strings_are_matched_in_the_text_and_never_streamed():
    from lenx.model.generate import Stops, TextStream

    stops = Stops(Letters(), ["cde", "x"], [25])
    ids = Letters().encode("abcdef")
    assert [stops.match(ids[:n]) for n in range(1, 7)] == [None, None, None, None, "cde", "cde"]
    assert stops.text(ids[:5], "cde") == "ab" and stops.match([1, 25]) == 25 and stops.text([1, 25], 25) == "b"
    assert stops.settled(ids[:4]) == "ab"  # "cd" may still begin "cde"
    shown = []
    stream = TextStream(Letters(), shown.append, stops)
    for i in ids:
        stream(0, torch.tensor([i]))
    stream.finish(stops.text(ids[:5], "cde"))
    assert "".join(shown) == "ab"
    free = []
    stream = TextStream(Letters(), free.append, Stops(Letters()))
    for i in ids:
        stream(0, torch.tensor([i]))
    stream.finish("abcdef")
    assert "".join(free) == "abcdef" and len(free) == 6  # nothing held back without stops
