"""Amaranth -> Verilog for Verilator and for the cocotb testbenches.

Port naming (Amaranth 0.5): a signature path joined by ``__`` (``i__payload``, ``i__valid``,
``i__ready``); the ``sync`` domain gives ``clk`` and ``rst`` (synchronous, active high); a struct
payload is one flat vector, first field at the LSB.
"""

from pathlib import Path

from amaranth.back import verilog

__all__ = ["write_verilog"]


def write_verilog(component, name: str, path) -> Path:
    """Write ``component`` as Verilog module ``name`` to ``path`` (created); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = verilog.convert(component, name=name, emit_src=False)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path
