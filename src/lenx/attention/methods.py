"""Method names and the parts they compose.

A name reads the way the papers write it: ``[temperature-][processor-][normaliser-]base``.
temperature: a query temperature (``ssmax``, ``logn``, ``l4temp``: temperature.py); processor: ``dape``
(DAPE, a 1x1 kernel), ``dapev2`` (DAPE V2, 1xk) or ``mta`` (Multi-Token Attention, softmax only);
normaliser: ``stickbreaking`` (softmax when absent); base: a position encoding (``nope`` when only a
normaliser or processor is named; ``mta`` alone is MTA's released configuration on RoPE).
Examples: ``rope``, ``kerple``, ``dapev2-kerple``, ``dape-fire``, ``stickbreaking``, ``dapev2-stickbreaking-alibi``,
``ssmax-rope``, ``logn-kerple``, ``ssmax-dapev2-kerple``, ``pope``, ``fox``, ``dapev2-fox``, ``mta``, ``mta-kerple``.
"""

from dataclasses import dataclass, replace
import difflib
import functools

from .alibi import ALiBi
from .cope import CoPE
from .dape import DapeV2
from .fire import FIRE
from .fox import ForgetGate
from .kerple import KerpleLog, KerplePower
from .mta import MTA
from .pope import PoPE
from .rope import RoPE
from .softmax import Softmax
from .stickbreaking import StickBreaking
from .t5 import T5Bias
from .temperature import QueryTemperature
from .xl import XLRelative


@dataclass(frozen=True)
class Part:
    """One registry entry: what the name means and how its module is built (cls.from_config(ctx),
    see parts.PartContext). role says where the module goes: "qk" (a q/k transform), "bias",
    "processor", "normaliser", or None (nothing to build). causal_only: no bidirectional form."""

    description: str
    cls: type | None = None
    role: str | None = None
    causal_only: bool = False

    def build(self, ctx):
        return self.cls.from_config(ctx)


BASES = {
    "nope": Part("no position encoding, causal mask only"),
    "rope": Part("rotary position embedding (Su et al. 2021)", RoPE, "qk"),
    "alibi": Part("ALiBi linear distance penalty (Press et al. 2022)", ALiBi, "bias"),
    "kerple": Part("Kerple logarithmic kernel bias (Chi et al. 2022)", KerpleLog, "bias"),
    "kerple-power": Part("Kerple power kernel bias (Chi et al. 2022)", KerplePower, "bias"),
    "fire": Part("FIRE learned functional bias (Li et al. 2024)", FIRE, "bias"),
    "t5": Part("T5 bucketed relative bias, shared by layers (Raffel et al. 2020)", T5Bias, "bias"),
    "cope": Part("contextual position encoding (Golovneva et al. 2024)", CoPE, "processor", causal_only=True),
    "xl": Part("Transformer-XL relative encoding (Dai et al. 2019)", XLRelative, "bias"),
    "pope": Part("PoPE polar position embedding: content in magnitudes, position in phases (Gopalakrishnan et al. "
                 "2025, arXiv 2509.10534)", PoPE, "qk"),
    "fox": Part("FoX forgetting attention: a data-dependent forget-gate bias on NoPE (Lin et al. 2025, "
                "arXiv 2503.02130)", ForgetGate, "bias", causal_only=True),
}
PROCESSORS = {
    "dape": Part("DAPE: per-entry MLP over [scores; bias] across heads (Zheng et al. 2024)", DapeV2, "processor"),
    "dapev2": Part("DAPE V2: 1xk convolution over [scores; bias] along keys (arXiv 2410.04798)", DapeV2, "processor"),
    "mta": Part("Multi-Token Attention, its released configuration: c_q x c_k query-key convolutions of the "
                "logits and the probabilities, heads mixed before and after the softmax, group norm (Golovneva et "
                "al. 2025, arXiv 2504.00927)", MTA, "processor", causal_only=True),
}
# processors that only run under softmax (MTA mixes the softmax's probabilities across heads)
SOFTMAX_ONLY = ("mta",)
# the base a processor alone names: MTA's paper runs it on RoPE
ALONE = {"mta": "rope"}
NORMALISERS = {
    "softmax": Part("softmax", Softmax, "normaliser"),
    "stickbreaking": Part("stick-breaking (Tan et al. 2024)", StickBreaking, "normaliser", causal_only=True),
}
TEMPERATURES = {
    "ssmax": Part("Scalable-Softmax query temperature s_h log n (Nakanishi 2025, arXiv 2501.19399)", QueryTemperature, "temperature"),
    "logn": Part("Qwen's log-n query temperature max(1, log_L n) (Bai et al. 2023, arXiv 2309.16609)",
                 QueryTemperature, "temperature"),
    "l4temp": Part("Llama 4's attention temperature tuning 1 + a log(floor(n / f) + 1), a 0.1, f 8192 (Meta 2025, "
                   "its model code)",
                   QueryTemperature, "temperature"),
}


@dataclass(frozen=True)
class MethodSpec:
    name: str
    base: str
    processor: str | None  # "dape", "dapev2", "mta" or None
    normaliser: str  # "softmax" or "stickbreaking"
    temperature: str | None = None  # "ssmax", "logn", "l4temp" or None

    @property
    def bias(self) -> str | None:
        """The base's name when it is an additive bias."""
        return self.base if BASES[self.base].role == "bias" else None

    @property
    def causal_only(self) -> bool:
        return (BASES[self.base].causal_only or NORMALISERS[self.normaliser].causal_only
                or (self.processor is not None and PROCESSORS[self.processor].causal_only))

    @property
    def description(self) -> str:
        words = [BASES[self.base].description]
        if self.processor:
            words.insert(0, PROCESSORS[self.processor].description + " on")
        if self.normaliser != "softmax":
            words.append("with " + NORMALISERS[self.normaliser].description + " instead of softmax")
        if self.temperature:
            words.insert(0, TEMPERATURES[self.temperature].description + " on")
        return " ".join(words)


class UnknownMethodError(ValueError):
    pass


def canonical_name(processor: str | None, normaliser: str, base: str) -> str:
    prefix = [p for p in (processor, None if normaliser == "softmax" else normaliser) if p]
    if normaliser != "softmax" and base == "nope":
        return "-".join(prefix)  # "stickbreaking" is stick-breaking on NoPE, as its paper writes it
    if processor in ALONE and ALONE[processor] == base and normaliser == "softmax":
        return processor  # "mta" is MTA's released configuration, on RoPE
    return "-".join(prefix + [base])


@functools.cache
def _all_names() -> tuple[str, ...]:
    return tuple(
        canonical_name(processor, normaliser, base)
        for processor in (None, *PROCESSORS)
        for normaliser in ("softmax", "stickbreaking")
        for base in BASES
        if not (processor and BASES[base].role == "processor")
        and not (processor in SOFTMAX_ONLY and normaliser != "softmax")
        and not (processor == "mta" and base == "fox")
    )


def parse_method(name: str) -> MethodSpec:
    """Parse a method name; unknown or impossible compositions raise with the valid names."""
    raw = name
    name = name.strip().lower()
    temperature, _, rest = name.partition("-")
    if temperature in TEMPERATURES:
        return with_temperature(temperature, rest, raw)
    tokens = name.split("-")
    processor = tokens.pop(0) if tokens and tokens[0] in PROCESSORS else None
    normaliser = "softmax"
    if tokens and tokens[0] in ("stickbreaking", "sb"):
        tokens.pop(0)
        normaliser = "stickbreaking"
    base = "-".join(tokens) if tokens else (ALONE.get(processor) if processor in ALONE and normaliser == "softmax"
                                           else "nope" if normaliser != "softmax" or processor else "")
    if base not in BASES:
        close = difflib.get_close_matches(name, all_methods(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownMethodError(
            f"unknown method {raw!r}.{hint} Names read [temperature-][processor-][normaliser-]base with temperature "
            f"in {{{', '.join(TEMPERATURES)}}}, processor in {{{', '.join(PROCESSORS)}}}, normaliser in "
            f"{{stickbreaking}}, base in {{{', '.join(BASES)}}}; "
            f"`lenx list` prints all {len(all_methods())}."
        )
    if processor and BASES[base].role == "processor":
        raise UnknownMethodError(
            f"{raw!r}: {base} is itself a score processor and does not compose with {processor}; use {base!r} "
            "alone or a DAPE processor on another base"
        )
    if processor in SOFTMAX_ONLY and normaliser != "softmax":
        raise UnknownMethodError(
            f"{raw!r}: {processor} mixes the heads' softmax probabilities (the paper's placement), which "
            f"{normaliser} does not give; use {processor}-<base> with softmax")
    if processor == "mta" and base == "fox":
        raise UnknownMethodError(
            f"{raw!r}: MTA's query convolution reads the scores of earlier query rows, and FoX's bias is bound "
            "to each step's own rows in decoding; mta-fox is not supported (use dapev2-fox or mta-<another base>)")
    return MethodSpec(canonical_name(processor, normaliser, base), base, processor, normaliser)


def all_methods() -> list[str]:
    """Every composition without a query temperature; each but stick-breaking's and CoPE's also takes
    one (with_temperature)."""
    return list(_all_names())


def with_temperature(temperature: str, rest: str, raw: str) -> MethodSpec:
    """The method `rest` with a query temperature before it. Refused where the temperature has no
    reason to be: stick-breaking (its weights do not share one denominator across the keys, so they
    do not fade as n grows, the fading the temperatures correct) and CoPE (its gates read q.k, so
    scaling q would move its positions, not only sharpen its logits)."""
    try:
        spec = parse_method(rest)
    except UnknownMethodError as e:
        raise UnknownMethodError(f"{raw!r}: after the query temperature {temperature!r}: {e}") from None
    if spec.temperature:
        raise UnknownMethodError(f"{raw!r}: one query temperature at most ({temperature} and {spec.temperature})")
    if spec.normaliser == "stickbreaking":
        raise UnknownMethodError(
            f"{raw!r}: a query temperature counters softmax's fading as a row's keys grow in number; "
            "stick-breaking does not fade that way (no denominator over the keys), so it takes none")
    if spec.base == "cope":
        raise UnknownMethodError(f"{raw!r}: CoPE's gates are sigmoids of q.k, so a query temperature would move its "
                                 "positions as well as sharpen its logits; use it on another base")
    return replace(spec, name=f"{temperature}-{spec.name}", temperature=temperature)
