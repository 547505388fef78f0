"""Draw ``docs/architecture.svg``: RingKV's subsystems and a request's path through them.

The picture that opens ``docs/ARCHITECTURE.md`` and the README. What it shows is data in this
module, so a test can read it (``tests/repo/test_architecture_picture.py``):

* :data:`BOXES`: one box per subsystem, with the packages it names and a short role; the
  host's subsystems (``ringkv.host.*``, ``ringkv.serve``, ``ringkv.cli``, ``ringkv.sim``) above,
  the FPGA's (``ringkv.hw.*``, drawn inside the box of ``ringkv.hw.top``) below, the card that
  holds the records and ``ringkv.defs``, which both sides import, at the bottom;
* :data:`ARROWS`: the request's path, each arrow numbered by its step in :data:`STEPS`, whose
  text is the legend in ``docs/ARCHITECTURE.md`` (``--legend`` prints it).

The drawing is deterministic: a fixed figure size and layout, the fonts matplotlib ships
(DejaVu), text kept as SVG text (``svg.fonttype = 'none'``), a fixed ``svg.hashsalt`` and
``svg.id``, no date in the metadata, no randomness. ``matplotlib`` is pinned in the ``dev``
extra because its SVG output changes between versions.

Usage::

    python tools/draw_architecture.py            # write docs/architecture.svg
    python tools/draw_architecture.py --check    # exit 1 if the committed file is out of date
    python tools/draw_architecture.py --png P    # also render a PNG preview to P (not committed)
    python tools/draw_architecture.py --legend   # print the numbered legend (Markdown)

``make docs-picture`` runs the first.
"""

import argparse
import io
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Box", "Arrow", "BOXES", "ARROWS", "STEPS", "SVG", "draw", "render_svg",
           "render_png", "legend_markdown", "main"]

ROOT = Path(__file__).resolve().parent.parent
SVG = Path("docs/architecture.svg")

#: Figure size in inches; every coordinate below is in inches from the top-left corner.
WIDTH, HEIGHT = 10.0, 9.35

# The grid: four columns; host rows H1, H2; FPGA rows F1, F2; the bottom row.
_COL_W = 2.0
_COL_X = tuple(round(0.3 + i * (_COL_W + 1.4 / 3), 3) for i in range(4))
_ROW_H = 0.9
_H1, _H2 = 1.6, 2.95
_F1, _F2 = 5.55, 6.9
_BOTTOM = 8.45


@dataclass(frozen=True)
class Box:
    """A subsystem: ``packages`` it names (none for the client and the card), a ``role`` in a
    few words.

    ``side`` is ``"host"``, ``"fpga"``, ``"shared"`` (``ringkv.defs``), ``"outside"`` (the
    client, the card) or ``"panel"`` (a box drawn around others). ``x``, ``y`` (top-left),
    ``w``, ``h`` are in inches from the figure's top-left corner; ``title`` replaces the
    package names as the box's heading.
    """

    key: str
    packages: tuple[str, ...]
    role: str
    side: str
    x: float
    y: float
    w: float = _COL_W
    h: float = _ROW_H
    title: str = ""


@dataclass(frozen=True)
class Arrow:
    """One arrow of the request's path: step ``step`` of :data:`STEPS`, from box ``src`` to
    box ``dst``.

    Drawing only: ``shift`` (inches, x and y) moves it so that two arrows between the same
    boxes run side by side; ``label`` is written on ``label_side`` (``"right"``, ``"left"``) of
    its number, which sits at the fraction ``at`` of its length; ``both``: a head at each end
    (the answer comes back the same way)."""

    step: int
    src: str
    dst: str
    label: str = ""
    shift: tuple[float, float] = (0.0, 0.0)
    both: bool = False
    at: float = 0.5
    label_side: str = "right"


def _cell(key, packages, role, side, col, row, **kw) -> Box:
    return Box(key, packages, role, side, _COL_X[col], row, **kw)


_RIGHT = _COL_X[3] + _COL_W

BOXES: tuple[Box, ...] = (
    # panels first: they are drawn below the boxes they hold
    Box("host", (), "Python and numpy, on any computer", "panel", 0.15, 1.13, 9.7, 2.9,
        title="host"),
    Box("top", ("ringkv.hw.top",), "RingKVTop: the subsystems wired together", "panel",
        0.15, 5.08, 9.7, 2.9, title="FPGA"),
    Box("client", (), "an OpenAI client, curl", "outside", _COL_X[0], 0.12,
        _COL_W, 0.68, title="client"),
    # host, row 1
    _cell("serve", ("ringkv.serve",), "OpenAI-compatible server, many devices",
          "host", 0, _H1),
    _cell("scheduler", ("ringkv.host.scheduler", "ringkv.host.batch"),
          "batching, hot tier, longest stored prefix", "host", 1, _H1),
    _cell("model", ("ringkv.host.model",),
          "numpy Mistral-style model, sampling, weights", "host", 2, _H1),
    _cell("golden", ("ringkv.host.golden",), "golden models, one per hardware block",
          "host", 3, _H1),
    # host, row 2
    _cell("cli", ("ringkv.cli",), "ringkv demo, chat, sim, storage, build", "host", 0, _H2),
    _cell("device", ("ringkv.host.device",),
          "FPGA and software devices, link, frames", "host", 1, _H2),
    _cell("record", ("ringkv.host.record",), "record format, card images, ls and fsck",
          "host", 2, _H2),
    _cell("sim", ("ringkv.sim",), "Verilator builds, SD card model",
          "host", 3, _H2),
    # between the sides
    Box("defs", ("ringkv.defs",), "imported by both sides: configuration, protocol, record "
        "format, numerics, hash", "shared", _COL_X[2], 4.21, _RIGHT - _COL_X[2], 0.7),
    # FPGA
    _cell("boards", ("ringkv.boards",), "ULX3S-85F top: PLL, UART, SD pins, LEDs; "
          "bitstream build; pin-level simulation", "fpga", 0, _F1),
    _cell("sdram", ("ringkv.hw.sdram",), "SDR SDRAM controller: bank machines, refresher, "
          "burst ports (not yet in the top)", "fpga", 0, _F2),
    _cell("link", ("ringkv.hw.link",), "UART, CRC-16 frame decoder and encoder", "fpga", 1, _F1),
    _cell("commands", ("ringkv.hw.commands",),
          "dispatcher, a unit per opcode family, recovery", "fpga", 2, _F1),
    _cell("attention", ("ringkv.hw.attention",),
          "SWA core: K/V rings, lanes, LSE merge", "fpga", 3, _F1),
    _cell("seal", ("ringkv.hw.seal",), "record MAC and key slots (sealed builds)",
          "fpga", 1, _F2),
    _cell("store", ("ringkv.hw.store",),
          "hash engine, directory + allocator, token memory", "fpga", 2, _F2),
    _cell("storage", ("ringkv.hw.storage",), "DMA, record header, SD controllers (4-bit, SPI)",
          "fpga", 3, _F2),
    # the cold store
    Box("card", (), "a record per region; an image file in simulation",
        "outside", _COL_X[3], _BOTTOM, _COL_W, 0.78, title="SD card: the cold store"),
)

#: The request's path, step by step: the legend of the numbers on the arrows.
STEPS: dict[int, str] = {
    1: "A request arrives: a chat completion at `ringkv.serve`, whose router sends it to the "
       "device holding its longest stored prefix (or a line typed into `ringkv chat`, "
       "`ringkv.cli`); the generated tokens go back the same way.",
    2: "That device's batching scheduler (`ringkv.host.batch`, on `ringkv.host.scheduler`) "
       "runs it with the device's other requests, a step at a time, and picks its path: "
       "continue the conversation resident in the hot tier, or look for a stored snapshot or "
       "prefix of its tokens.",
    3: "`ringkv.host.device` writes the tokens into the device's token memory and sends "
       "`QUERY n` (the session's own snapshot) or `QUERY_PREFIX` (the longest stored prefix, "
       "then `QUERY` of that).",
    4: "The frames cross the byte link: the board's USB UART, or a TCP socket into the "
       "Verilator simulation (`ringkv.sim`), with the same driver code.",
    5: "`ringkv.hw.link` checks each frame's CRC (a bad frame has no effect); "
       "`ringkv.hw.commands` hands the request to the unit of its opcode family.",
    6: "`ringkv.hw.store` hashes the tokens (one per clock) and looks `(count, hash)` up in "
       "the cache directory (`QUERY_PREFIX`: every prefix length, the longest stored wins).",
    7: "On a directory hit, `ringkv.hw.storage`'s DMA reads the record from the SD card: "
       "header, tokens (compared with token memory), K/V, the payload CRC checked on the fly "
       "(and in sealed builds the record MAC, `ringkv.hw.seal`).",
    8: "Import: the K/V stream into `ringkv.hw.attention`'s rings; the answer is `HIT` only if "
       "every check passed, else `MISS`, and the rings are left empty.",
    9: "On a miss, and for the tokens after an imported prefix, `ringkv.host.model` computes: "
       "chunked prefill (exporting checkpoints on the way), then decode.",
    10: "For every layer the host sends q/k/v in `ATTN_PREFILL` / `ATTN_DECODE` frames; the "
        "attention core writes K/V into the layer's rings first, then attends the window on "
        "its split-KV lanes and returns the outputs.",
    11: "After inference `EXPORT n` inserts `(n, hash)` into the directory, which takes a "
        "storage region from its allocator (evicting the least recently used snapshot when "
        "full), and the DMA writes the record from token memory and the rings to the card, "
        "header last: a power cut leaves the previous snapshot valid.",
}

_PAIR = 0.32  # how far apart the import and export arrows run
ARROWS: tuple[Arrow, ...] = (
    Arrow(1, "client", "serve", both=True, at=0.35),
    Arrow(2, "serve", "scheduler", both=True),
    Arrow(3, "scheduler", "device", "QUERY / QUERY_PREFIX", label_side="left"),
    Arrow(4, "device", "link", "frames: USB UART or TCP", label_side="left", at=0.4),
    Arrow(5, "link", "commands"),
    Arrow(6, "commands", "store", "hash, look up"),
    Arrow(7, "card", "storage", "read", shift=(-_PAIR, 0), label_side="left"),
    Arrow(8, "storage", "attention", "import", shift=(-_PAIR, 0), label_side="left"),
    Arrow(9, "scheduler", "model"),
    Arrow(10, "model", "device"),
    Arrow(10, "commands", "attention"),
    Arrow(11, "attention", "storage", "export", shift=(_PAIR, 0)),
    Arrow(11, "storage", "card", "write", shift=(_PAIR, 0)),
)

# Colours: the host blue, the FPGA orange, the shared definitions green, the path purple.
_STYLE = {
    "host": ("#ffffff", "#3d6fa8"),
    "fpga": ("#ffffff", "#b8661e"),
    "shared": ("#e9f5e9", "#3f8f3f"),
    "outside": ("#f1f1f1", "#6b6b6b"),
}
_PANEL = {"host": ("#edf3fa", "#3d6fa8"), "top": ("#fcf0e3", "#b8661e")}
_PATH = "#7a2e8e"
# The generic families, with the fonts matplotlib ships first: it measures and draws with those,
# and the SVG names the whole list (CSS), so a browser without DejaVu picks a similar font.
_MONO = "monospace"
_SANS = "sans-serif"
_NAME_PT, _ROLE_PT, _TITLE_PT, _LABEL_PT = 10.0, 9.0, 10.5, 8.6


def _by_key() -> dict[str, Box]:
    return {box.key: box for box in BOXES}


def _wrap(text: str, width_in: float, points: float) -> str:
    # DejaVu Sans averages about 0.55 em per character; 0.6 leaves room for a wider fallback
    return textwrap.fill(text, max(8, int(width_in * 72 / (points * 0.6))))


def _clip(box: Box, inside, outside):
    """Where the segment from ``inside`` (within ``box``) to ``outside`` leaves the box."""
    (x0, y0), (x1, y1) = inside, outside
    t = 1.0
    for lo, hi, p0, p1 in ((box.x, box.x + box.w, x0, x1), (box.y, box.y + box.h, y0, y1)):
        if p1 > hi:
            t = min(t, (hi - p0) / (p1 - p0))
        elif p1 < lo:
            t = min(t, (lo - p0) / (p1 - p0))
    return x0 + t * (x1 - x0), y0 + t * (y1 - y0)


def _endpoints(src: Box, dst: Box, shift):
    """The arrow between the two boxes' centres, moved by ``shift``, clipped to their edges
    (with a small gap)."""
    sx, sy = src.x + src.w / 2 + shift[0], src.y + src.h / 2 + shift[1]
    dx, dy = dst.x + dst.w / 2 + shift[0], dst.y + dst.h / 2 + shift[1]
    p, q = _clip(src, (sx, sy), (dx, dy)), _clip(dst, (dx, dy), (sx, sy))
    ux, uy = q[0] - p[0], q[1] - p[1]
    norm = (ux ** 2 + uy ** 2) ** 0.5
    gap = 0.04
    return ((p[0] + ux / norm * gap, p[1] + uy / norm * gap),
            (q[0] - ux / norm * gap, q[1] - uy / norm * gap))


def draw():
    """The figure (a ``matplotlib.figure.Figure``, not registered with pyplot)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

    fig = Figure(figsize=(WIDTH, HEIGHT))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, WIDTH)
    ax.set_ylim(HEIGHT, 0)  # y grows downwards, as the coordinates above
    ax.set_axis_off()

    def rounded(box, face, edge, lw, z):
        ax.add_patch(FancyBboxPatch((box.x, box.y), box.w, box.h,
                                    boxstyle="round,pad=0,rounding_size=0.08",
                                    facecolor=face, edgecolor=edge, linewidth=lw, zorder=z))

    def text(x, y, s, size, color, font=_SANS, **kw):
        ax.text(x, y, s, fontsize=size, fontfamily=font, color=color, **kw)

    for box in BOXES:
        if box.side == "panel":
            face, edge = _PANEL[box.key]
            rounded(box, face, edge, 1.6, 0)
            text(box.x + 0.15, box.y + 0.12, box.title, _TITLE_PT, edge, fontweight="bold",
                 va="top")
            if box.packages:
                text(box.x + 0.75, box.y + 0.135, "  ".join(box.packages), _NAME_PT, edge,
                     _MONO, fontweight="bold", va="top")
            text(box.x + box.w - 0.15, box.y + 0.14, box.role, _ROLE_PT, "#333333",
                 va="top", ha="right")
            continue
        face, edge = _STYLE[box.side]
        rounded(box, face, edge, 1.3, 2)
        cx = box.x + box.w / 2
        text(cx, box.y + 0.1, box.title or "  ".join(box.packages), _NAME_PT, edge,
             _SANS if box.title else _MONO, fontweight="bold", va="top", ha="center", zorder=3)
        text(cx, box.y + (0.31 if box.h > 0.6 else 0.29), _wrap(box.role, box.w - 0.2, _ROLE_PT),
             _ROLE_PT, "#222222", va="top", ha="center", linespacing=1.25, zorder=3)

    boxes = _by_key()
    for arrow in ARROWS:
        (x0, y0), (x1, y1) = _endpoints(boxes[arrow.src], boxes[arrow.dst], arrow.shift)
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1),
                                     arrowstyle="<|-|>" if arrow.both else "-|>",
                                     mutation_scale=11, linewidth=1.6, color=_PATH,
                                     shrinkA=0, shrinkB=0, zorder=4))
        mx, my = x0 + arrow.at * (x1 - x0), y0 + arrow.at * (y1 - y0)
        ax.add_patch(Circle((mx, my), 0.115, facecolor=_PATH, edgecolor="white",
                            linewidth=1.0, zorder=5))
        text(mx, my, str(arrow.step), 8.2, "white", fontweight="bold", ha="center",
             va="center_baseline", zorder=6)
        if arrow.label:
            left = arrow.label_side == "left"
            text(mx + (-0.17 if left else 0.17), my, arrow.label, _LABEL_PT, _PATH,
                 style="italic", ha="right" if left else "left", va="center", zorder=6)

    # the key, bottom left
    x, y = _COL_X[0], _BOTTOM + 0.08
    ax.add_patch(Circle((x + 0.115, y + 0.1), 0.115, facecolor=_PATH, edgecolor="white",
                        zorder=5))
    text(x + 0.115, y + 0.1, "1", 8.2, "white", fontweight="bold", ha="center",
         va="center_baseline", zorder=6)
    text(x + 0.32, y + 0.1, "a request's path, step by step (the legend is in "
         "docs/ARCHITECTURE.md)", _ROLE_PT, "#222222", va="center")
    text(x + 0.32, y + 0.42, "each box names its package: from ringkv.hw.store import "
         "CacheDirectory", _ROLE_PT, "#222222", va="center")
    return fig


def _rc():
    return {"svg.fonttype": "none", "svg.hashsalt": "ringkv-architecture",
            "svg.id": "ringkv-architecture", "font.family": _SANS,
            "font.sans-serif": ["DejaVu Sans", "Verdana"],
            "font.monospace": ["DejaVu Sans Mono", "Menlo", "Consolas"]}


def render_svg() -> bytes:
    """The SVG as bytes, the same on every run of the pinned matplotlib."""
    import matplotlib

    with matplotlib.rc_context(_rc()):
        out = io.BytesIO()
        draw().savefig(out, format="svg", metadata={"Date": None,
                                                    "Creator": "tools/draw_architecture.py"})
    return out.getvalue()


def render_png(path: Path, dpi: int = 100) -> None:
    import matplotlib

    with matplotlib.rc_context(_rc()):
        draw().savefig(path, format="png", dpi=dpi)


def legend_markdown() -> str:
    """The numbered legend of :data:`STEPS`, as Markdown wrapped at 100 columns."""
    return "\n".join(textwrap.fill(f"{number}. {text}", 100, break_on_hyphens=False,
                                   break_long_words=False,
                                   subsequent_indent=" " * (len(str(number)) + 2))
                     for number, text in sorted(STEPS.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if {SVG} differs from what this tool draws")
    parser.add_argument("--png", type=Path, help="also render a PNG preview to this path")
    parser.add_argument("--legend", action="store_true", help="print the legend and exit")
    args = parser.parse_args(argv)
    if args.legend:
        print(legend_markdown())
        return 0
    svg = render_svg()
    path = ROOT / SVG
    if args.check:
        if not path.exists() or path.read_bytes() != svg:
            print(f"{SVG} is out of date: run `make docs-picture`", file=sys.stderr)
            return 1
    else:
        path.write_bytes(svg)
    if args.png:
        render_png(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
