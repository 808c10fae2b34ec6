"""Progress bars (tqdm on stderr when installed; silently none otherwise)."""
from __future__ import annotations

import sys

from .errors import optional


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bar(enabled: bool | None, *, total: float | None = None, desc: str = "", unit: str = "it",
        unit_scale: bool = False):
    """A tqdm bar, or a no-op one. ``enabled=None`` shows the bar only when stderr is a terminal."""
    if enabled is False:
        return _NoBar()
    tqdm = optional("tqdm")
    if tqdm is None:
        return _NoBar()
    if enabled is None and not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return _NoBar()
    return tqdm.tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=sys.stderr,
                     dynamic_ncols=True, leave=False, mininterval=0.2)
