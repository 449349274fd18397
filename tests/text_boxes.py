"""Where the texts of a figure land: every title, label, drawn tick label, annotation and legend entry, with its box.

A report's figure must not print one text over another (a panel title on the row above's tick labels, two line-end
labels on one spot): :func:`overlapping` lists the pairs that do, from the boxes matplotlib itself computes.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.text import Text


def drawn_texts(fig: Figure) -> list[tuple[str, object]]:
    """``(text [where], window box)`` of every non-empty text the figure draws (tick labels only where drawn)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []

    def add(text: Text | None, where: str) -> None:
        if text is None or not text.get_visible() or not text.get_text().strip():
            return
        box = Text.get_window_extent(
            text, renderer
        )  # the text alone, not an annotation's leader line
        if box.width > 0 and box.height > 0:
            found.append((f"{text.get_text()[:50]} [{where}]", box))

    add(fig._suptitle, "suptitle")
    for text in fig.texts:
        if text is not fig._suptitle:
            add(text, "figure")
    for i, ax in enumerate(fig.axes):
        where = f"axes {i}: {ax.get_title()[:20]}"
        for text in (
            ax.title,
            ax._left_title,
            ax._right_title,
            ax.xaxis.label,
            ax.yaxis.label,
            *ax.texts,
        ):
            add(text, where)
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis._update_ticks():  # the ticks inside the view: the ones drawn
                for label in (tick.label1, tick.label2):
                    add(label, where)
        legend = ax.get_legend()
        for text in legend.get_texts() if legend is not None else ():
            add(text, where)
    return found


def overlapping(fig: Figure, slack_px: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose boxes share more than ``slack_px`` pixels both ways."""
    texts = drawn_texts(fig)
    out = []
    for i, (a, box_a) in enumerate(texts):
        for b, box_b in texts[i + 1 :]:
            if (
                min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0) > slack_px
                and min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0) > slack_px
            ):
                out.append((a, b))
    return out
