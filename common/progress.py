"""Progress of long work on a terminal: a bar with the share done and an ETA (``campaign run --wait``), or plain
lines where the output is not a terminal (a CI log): the same facts, one line each time they change."""

from __future__ import annotations

from collections.abc import Callable

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


def rate_eta(elapsed_s: float, done: int, total: int) -> float | None:
    """Seconds left at the pace so far (the same time per item); None before the first item is done."""
    if done <= 0:
        return None
    return elapsed_s / done * max(total - done, 0)


class Printer:
    """Progress written as it changes, through ``write`` (text as it is, no newline added): on a terminal the bar
    redrawn in place, elsewhere a plain line each time it reads differently, at most one per ``step`` items done
    (and always the last), so a log of 256 nodes gets a few lines, not 256."""

    def __init__(self, write: Callable[[str], None], *, tty: bool, what: str = "runs", step: int = 1) -> None:
        self.write, self.tty, self.what, self.step = write, tty, what, max(step, 1)
        self.last_text: str | None = None
        self.last_done: int | None = None

    def show(self, done: int, total: int, *, eta_s: float | None = None, status: str = "", detail: str = "") -> None:
        if self.tty:
            self.write(f"\r{bar(done, total, what=self.what, eta_s=eta_s)}{'  ' + status if status else ''}\x1b[K")
            return
        if self.last_done is not None and done < total and 0 < done - self.last_done < self.step:
            return
        text = (f"{status}: " if status else "") + line(done, total, what=self.what, eta_s=eta_s, detail=detail)
        if text != self.last_text:
            self.write(text + "\n")
            self.last_text, self.last_done = text, done

    def end(self) -> None:
        """Leave the terminal's bar on its own line."""
        if self.tty:
            self.write("\n")
