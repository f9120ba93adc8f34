"""Method names and the parts they compose.

A name reads the way the papers write it: ``[processor-][normaliser-]base``.
processor: ``dape`` (DAPE, a 1x1 kernel) or ``dapev2`` (DAPE V2, 1xk); normaliser: ``stickbreaking``
(softmax when absent); base: a position encoding (``nope`` when only a normaliser is named).
Examples: ``rope``, ``kerple``, ``dapev2-kerple``, ``dape-fire``, ``stickbreaking``, ``dapev2-stickbreaking-alibi``.
"""

from dataclasses import dataclass
import difflib
import functools

BASES = {
    "nope": "no position encoding, causal mask only",
    "rope": "rotary position embedding (Su et al. 2021)",
    "alibi": "ALiBi linear distance penalty (Press et al. 2022)",
    "kerple": "Kerple logarithmic kernel bias (Chi et al. 2022)",
    "kerple-power": "Kerple power kernel bias (Chi et al. 2022)",
    "fire": "FIRE learned functional bias (Li et al. 2024)",
    "t5": "T5 bucketed relative bias, shared by layers (Raffel et al. 2020)",
    "cope": "contextual position encoding (Golovneva et al. 2024)",
    "xl": "Transformer-XL relative encoding (Dai et al. 2019)",
}
PROCESSORS = {
    "dape": "DAPE: per-entry MLP over [scores; bias] across heads (Zheng et al. 2024)",
    "dapev2": "DAPE V2: 1xk convolution over [scores; bias] along keys (arXiv 2410.04798)",
}
NORMALISERS = {
    "softmax": "softmax",
    "stickbreaking": "stick-breaking (Tan et al. 2024)",
}
# Biases added to the scores (the rest of the bases are a q/k transform, a processor, or nothing).
ADDITIVE_BIASES = ("alibi", "kerple", "kerple-power", "fire", "t5", "xl")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    base: str
    processor: str | None  # "dape", "dapev2" or None
    normaliser: str  # "softmax" or "stickbreaking"

    @property
    def bias(self) -> str | None:
        return self.base if self.base in ADDITIVE_BIASES else None

    @property
    def description(self) -> str:
        words = [BASES[self.base]]
        if self.processor:
            words.insert(0, PROCESSORS[self.processor] + " on")
        if self.normaliser != "softmax":
            words.append("with " + NORMALISERS[self.normaliser] + " instead of softmax")
        return " ".join(words)


class UnknownMethodError(ValueError):
    pass


def canonical_name(processor: str | None, normaliser: str, base: str) -> str:
    prefix = [p for p in (processor, None if normaliser == "softmax" else normaliser) if p]
    if normaliser != "softmax" and base == "nope":
        return "-".join(prefix)  # "stickbreaking" is stick-breaking on NoPE, as its paper writes it
    return "-".join(prefix + [base])


@functools.cache
def _all_names() -> tuple[str, ...]:
    return tuple(
        canonical_name(processor, normaliser, base)
        for processor in (None, "dape", "dapev2")
        for normaliser in ("softmax", "stickbreaking")
        for base in BASES
        if not (processor and base == "cope")
    )


def parse_method(name: str) -> MethodSpec:
    """Parse a method name; unknown or impossible compositions raise with the valid names."""
    raw = name
    name = name.strip().lower()
    tokens = name.split("-")
    processor = tokens.pop(0) if tokens and tokens[0] in PROCESSORS else None
    normaliser = "softmax"
    if tokens and tokens[0] in ("stickbreaking", "sb"):
        tokens.pop(0)
        normaliser = "stickbreaking"
    base = "-".join(tokens) if tokens else ("nope" if normaliser != "softmax" or processor else "")
    if base not in BASES:
        close = difflib.get_close_matches(name, all_methods(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownMethodError(
            f"unknown method {raw!r}.{hint} Names read [processor-][normaliser-]base with processor in "
            f"{{{', '.join(PROCESSORS)}}}, normaliser in {{stickbreaking}}, base in {{{', '.join(BASES)}}}; "
            f"`lenx list` prints all {len(all_methods())}."
        )
    if processor and base == "cope":
        raise UnknownMethodError(
            f"{raw!r}: CoPE is itself a score processor and does not compose with {processor}; use 'cope' alone "
            "or a DAPE processor on another base"
        )
    return MethodSpec(canonical_name(processor, normaliser, base), base, processor, normaliser)


def all_methods() -> list[str]:
    return list(_all_names())
