"""The definitions layer's enums as Amaranth shapes.

:mod:`ringkv.defs` is pure Python: its enums (opcodes, statuses) are plain ``enum.Enum``
classes, and the width of each field is a constant beside it. :func:`shaped` turns one into an
``amaranth.lib.enum.Enum`` of that width with the same names and values, so that gateware
signals and struct fields of that type show the member names in waveforms and in the generated
Verilog's attributes. Values are defined once, in ``ringkv.defs``; nothing here adds a member.
"""

from amaranth.hdl import Shape
from amaranth.lib import enum as hdl_enum

__all__ = ["shaped"]


def shaped(definition: type, shape, *, module: str | None = None) -> type:
    """An ``amaranth.lib.enum.Enum`` with the members of the plain enum ``definition``.

    ``shape`` is the field's width (an int or a ``Shape``). The new class has the definition's
    name, qualified name and docstring; ``module`` names the module that exports it.
    """
    name = definition.__name__
    width = Shape.cast(shape)
    for member in definition:
        low = -(1 << (width.width - 1)) if width.signed else 0
        high = (1 << (width.width - (1 if width.signed else 0))) - 1
        if not low <= member.value <= high:
            raise ValueError(f"{definition.__qualname__}.{member.name} = {member.value} does "
                             f"not fit {width!r}")
    namespace = hdl_enum.EnumMeta.__prepare__(name, (hdl_enum.Enum,), shape=shape)
    for member in definition:
        namespace[member.name] = member.value
    namespace["__doc__"] = definition.__doc__
    namespace["__qualname__"] = definition.__qualname__
    namespace["__module__"] = module or definition.__module__
    return hdl_enum.EnumMeta(name, (hdl_enum.Enum,), namespace, shape=shape)
