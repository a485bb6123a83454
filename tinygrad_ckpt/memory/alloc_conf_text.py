"""PYTORCH_CUDA_ALLOC_CONF's text read as PyTorch reads it: "key:value" options, separated by commas.

    options("expandable_segments:True, roundup_power2_divisions:[256:1,>:4]")
    # {'expandable_segments': 'True', 'roundup_power2_divisions': [('256', '1'), ('>', '4')]}

The text is cut into tokens at ',', ':', '[' and ']' (spaces dropped), then read option by option, each a key
PyTorch knows, a ':' and its value (AllocatorConfig::lexArgs / parseArgs, CUDAAllocatorConfig::parseArgs). An
unknown key ("expandable_segments=True" is one: a '=' is no separator) or a missing ':' or ',' is refused, as
PyTorch refuses it ("Unrecognized CachingAllocator option"). What each value means is alloc_conf.py's.
"""

from __future__ import annotations

import re

SIMULATED = ("max_split_size_mb", "max_non_split_rounding_mb", "roundup_power2_divisions", "expandable_segments")
# accepted by PyTorch but changing nothing the simulation places (its host-pinned memory, its locking, ...)
NO_EFFECT = ("backend", "garbage_collection_threshold", "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
             "pinned_use_cuda_host_register", "pinned_use_hip_host_register", "pinned_num_register_threads",
             "pinned_use_background_threads", "pinned_reserve_segment_size_mb", "graph_capture_record_stream_reuse")
KEYS = SIMULATED + NO_EFFECT
_SEPARATORS = (",", ":", "[", "]")


def tokens(conf: str) -> list[str]:
    """The tokens of `conf`: each separator alone, the text between them with its spaces dropped."""
    return [t for t in re.split(r"([,:\[\]])", re.sub(r"\s+", "", conf)) if t]


def options(conf: str, who: str = "alloc_conf") -> dict:
    """{key: value text} of `conf` (the last one given wins, as in PyTorch); a list value ("[256:1,>:4]") as
    [(interval, divisions), ...]. ValueError naming `who`, the option and the accepted keys for what PyTorch
    refuses."""
    if not isinstance(conf, str):
        raise TypeError(f"{lead(who)}takes a string in PYTORCH_CUDA_ALLOC_CONF's syntax, such as "
                        f"'expandable_segments:True', got {conf!r}")
    found, toks, i = {}, tokens(conf), 0
    while i < len(toks):
        key = toks[i]
        if key not in KEYS:
            raise ValueError(unrecognized(who, key, conf))
        if toks[i + 1:i + 2] != [":"] or i + 2 >= len(toks) or toks[i + 2] in (",", ":", "]"):
            raise ValueError(f"{lead(who)}option {key} needs a value after a ':' (e.g. '{example(key)}'), in {conf!r}")
        if toks[i + 2] == "[":
            found[key], i = _pairs(toks, i + 3, key, who, conf)
        else:
            found[key], i = toks[i + 2], i + 3
        if i < len(toks) and toks[i] != ",":
            raise ValueError(f"{lead(who)}expected a ',' after '{key}:{toks[i - 1]}', got {toks[i]!r} in {conf!r}: "
                             "options are separated by commas, e.g. 'expandable_segments:True,max_split_size_mb:256'")
        i += 1
    return found


def _pairs(toks: list, i: int, key: str, who: str, conf: str) -> tuple[list, int]:
    """The [k:v,k:v,...] list starting at token i (after its '['); returns it and the index after its ']'."""
    pairs = []
    while i + 2 < len(toks) and toks[i + 1] == ":" and toks[i] not in _SEPARATORS and toks[i + 2] not in _SEPARATORS:
        pairs.append((toks[i], toks[i + 2]))
        i += 3
        if toks[i:i + 1] == [","]:
            i += 1
        elif toks[i:i + 1] == ["]"]:
            return pairs, i + 1
    raise ValueError(f"{lead(who)}cannot read the list of option {key} in {conf!r}: write it as "
                     "'roundup_power2_divisions:[256:1,512:2,>:4]' (MiB interval: divisions, ..., '>': the rest)")


def unrecognized(who: str, key: str, conf: str) -> str:
    """The error for an option PyTorch does not know (with the ':' it wants if a '=' was written)."""
    hint = ""
    if "=" in key:
        name, _, value = key.partition("=")
        hint = f" (options take a ':', not a '=': write '{name}:{value}')"
    return (f"{lead(who)}unknown allocator option {key!r} in {conf!r}{hint}; PyTorch refuses it too (\"Unrecognized "
            f"CachingAllocator option\"). The options are {', '.join(KEYS)}")


def lead(who: str) -> str:
    """What an error begins with: the call or flag it is about ("" when the caller says it, as argparse does)."""
    return f"{who}: " if who else ""


def example(key: str) -> str:
    """An option written correctly, for an error message."""
    values = {"max_split_size_mb": "256", "max_non_split_rounding_mb": "64", "roundup_power2_divisions": "4",
              "backend": "native", "garbage_collection_threshold": "0.6", "pinned_num_register_threads": "8",
              "pinned_reserve_segment_size_mb": "64"}
    return f"{key}:{values.get(key, 'True')}"
