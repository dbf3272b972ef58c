"""Progress of long work on a terminal: a bar with the share done and an ETA (``campaign run --wait``), or plain
lines where the output is not a terminal (a CI log): the same facts, one line each time they change."""

from __future__ import annotations

WIDTH = 30


def eta_text(seconds: float | None) -> str:
    """'ETA 4 s', 'ETA 3 min 07 s', 'ETA 2 h 05 min'; 'ETA unknown' before anything was measured."""
    if seconds is None:
        return "ETA unknown"
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"ETA {seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"ETA {minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"ETA {hours} h {minutes:02d} min"


def bar(done: int, total: int, *, what: str = "runs", eta_s: float | None = None, width: int = WIDTH) -> str:
    """'[#########.....................]  12/40 runs  30%  ETA 3 min 20 s' (no ETA once everything is done)."""
    share = done / total if total else 1.0
    filled = min(width, round(share * width))
    tail = "" if done >= total else f"  {eta_text(eta_s)}"
    return f"[{'#' * filled}{'.' * (width - filled)}]  {done}/{total} {what}  {share:.0%}{tail}"


def line(done: int, total: int, *, what: str = "runs", eta_s: float | None = None, detail: str = "") -> str:
    """The plain-text form for logs: '12/40 runs done (30%), ETA 3 min 20 s; running=2 succeeded=12'."""
    share = done / total if total else 1.0
    eta = "" if done >= total else f", {eta_text(eta_s)}"
    return f"{done}/{total} {what} done ({share:.0%}){eta}" + (f"; {detail}" if detail else "")
