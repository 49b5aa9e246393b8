"""The house style of every matplotlib figure strata_lab draws (CLI PNGs, widgets, notebooks).

* Both JupyterLab themes: transparent figure and axes, and text, ticks, spines and legends in a mid grey
  (`INK`) that reads on the light theme's white and the dark theme's near-black, as the widgets do.
* Legends outside the data (`legend_outside`), integer ticks on call axes (`integer_ticks`), log axes that
  label the values plotted in plain numbers (`readable_log_axis`: no `2x10^3` minor-tick pile-ups).

matplotlib is imported when a function runs.

>>> human(128), human(4096), human(65536), human(2.5e6), human(0.5)
('128', '4096', '64K', '2.5M', '0.5')
"""
from __future__ import annotations

__all__ = ["INK", "house_style", "legend_outside", "integer_ticks", "readable_log_axis", "human", "save"]

INK = "#808080"   # contrast ~3.9:1 on white, ~5:1 on JupyterLab's dark background


def human(v: float) -> str:
    """A tick label: plain up to 9999, then K / M / G with up to 3 significant digits."""
    a = abs(v)
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1024.0 if float(v).is_integer() and a >= 1e4 and
                                                  (a / 1024).is_integer() else 1e3)):
        if a >= 1e4 and a >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v:g}"


def house_style(fig):
    """Restyle a finished figure in place (every axes, its labels, ticks, spines, legend); returns it."""
    fig.patch.set_alpha(0.0)
    for ax in fig.axes:
        ax.set_facecolor("none")
        ax.tick_params(colors=INK, which="both")
        for spine in ax.spines.values():
            spine.set_edgecolor(INK)
        for text in (ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts):
            text.set_color(INK)
        legend = ax.get_legend()
        if legend is not None:
            legend.get_frame().set_alpha(0.0)
            for text in legend.get_texts():
                text.set_color(INK)
            if legend.get_title() is not None:
                legend.get_title().set_color(INK)
    for text in fig.texts:
        text.set_color(INK)
    if getattr(fig, "_suptitle", None) is not None:
        fig._suptitle.set_color(INK)
    return fig


def legend_outside(ax, **kw):
    """The legend to the right of the axes, never over the data."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False,
                     fontsize=kw.pop("fontsize", "small"), **kw)


def integer_ticks(ax, axis: str = "x"):
    """Whole-number ticks (calls are counted, never 2.5)."""
    from matplotlib.ticker import MaxNLocator

    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True))
    return ax


def readable_log_axis(ax, values, axis: str = "x"):
    """A log scale ticked at the values plotted, labelled in plain numbers (base 2 when they all are
    powers of two), without minor-tick labels."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    vals = sorted({float(v) for v in values if v and v > 0})
    pow2 = bool(vals) and all(float(v).is_integer() and int(v) & (int(v) - 1) == 0 for v in vals)
    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2 if pow2 else 10)
    if len(vals) > 12:   # too many to label each: every other one
        vals = vals[::2]
    target.set_major_locator(FixedLocator(vals))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: human(v)))
    target.set_minor_locator(NullLocator())
    target.set_minor_formatter(NullFormatter())
    return ax


def save(fig, path, dpi: int = 100) -> None:
    """Save in the house style (transparent, tight around outside legends) and close the figure."""
    import matplotlib.pyplot as plt

    house_style(fig)
    fig.savefig(path, dpi=dpi, bbox_inches="tight", transparent=True)
    plt.close(fig)
