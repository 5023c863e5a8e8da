"""A link's shape and the Toxiproxy toxics that realise it: pure data, no I/O, read by
the scenarios (`[links]`), both backends (the injector's toxics) and the simulator's
links alike.

Link profiles are small frozen dataclasses with units in their field names.
Toxiproxy's `bandwidth` toxic takes a rate in KB/s (kilobytes); our profiles
speak kilobits per second (`bandwidth_kbps`), the unit WAN links are sold in.
"""
from __future__ import annotations

from dataclasses import dataclass

STREAMS = ("upstream", "downstream")  # upstream = client -> server, downstream = server -> client


@dataclass(frozen=True)
class LinkProfile:
    """A WAN link's shape, applied to both directions of a proxy."""

    bandwidth_kbps: float | None = None  # kilobits per second; None = unlimited
    latency_ms: float = 0.0
    jitter_ms: float = 0.0

    def __post_init__(self):
        if self.bandwidth_kbps is not None and not self.bandwidth_kbps >= 8:
            raise ValueError(f"bandwidth_kbps must be >= 8 (1 KB/s, Toxiproxy's resolution) or None, got {self.bandwidth_kbps}")
        if not self.latency_ms >= 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")
        if not 0 <= self.jitter_ms <= self.latency_ms:
            raise ValueError(f"jitter_ms must be in [0, latency_ms={self.latency_ms}], got {self.jitter_ms}")

    def toxics(self) -> list[dict]:
        """The Toxiproxy toxics (as API dicts) that realise this profile, per direction."""
        out = []
        for stream in STREAMS:
            if self.bandwidth_kbps is not None:
                out.append(toxic_spec("bandwidth", stream, rate=max(1, round(self.bandwidth_kbps / 8))))
            if self.latency_ms:
                # Toxiproxy adds the full latency on each direction; a profile's
                # latency_ms is one-way, so a round trip costs 2 * latency_ms.
                out.append(toxic_spec("latency", stream, latency=round(self.latency_ms), jitter=round(self.jitter_ms)))
        return out


def toxic_spec(kind: str, stream: str, *, name: str | None = None, toxicity: float = 1.0, **attributes) -> dict:
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {STREAMS}, got {stream!r}")
    return {"name": name or f"{kind}_{stream}", "type": kind, "stream": stream,
            "toxicity": toxicity, "attributes": attributes}
