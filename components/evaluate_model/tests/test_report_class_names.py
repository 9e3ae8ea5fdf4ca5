"""Class names are the data's text: the report draws them as written, never as matplotlib's
mathtext (issue 28: a class named ``$\\textbf{B}$`` was a traceback in evaluate's report)."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg

from kubetrain.components.evaluate_model.report import (
    CONFUSION_FILE,
    build_report,
    confusion_matrix_figure,
)
from kubetrain.components.evaluate_model.tests.test_report import (
    synthetic_card,
    synthetic_evaluation,
)

#: Names matplotlib would parse: invalid mathtext, valid mathtext, a lone dollar, TeX markup.
MATH_NAMES = ["$\\textbf{B}$", "$x$", "$", "\\$5 a_b^c"]


def test_a_mathtext_class_name_is_a_report_not_a_traceback():
    report = build_report(synthetic_card(), synthetic_evaluation(MATH_NAMES), {"source": "x"})
    assert report.images[CONFUSION_FILE].startswith(b"\x89PNG\r\n\x1a\n")
    assert "$\\textbf{B}$" in report.html.split("<h3>Counts", 1)[1]


def test_class_names_are_drawn_as_written():
    """Each tick label is the name itself with math parsing off, and ``$x$`` takes the room of
    three characters, not of one italic x (what mathtext draws)."""
    classes = ["$x$", "x"]
    figure = confusion_matrix_figure(classes, [[3, 1], [0, 4]])
    renderer = FigureCanvasAgg(figure).get_renderer()
    axes = figure.axes[0]
    for labels in (axes.get_xticklabels(), axes.get_yticklabels()):
        assert [label.get_text() for label in labels] == classes
        assert not any(label.get_parse_math() or label.get_usetex() for label in labels)
    dollar, plain = (label.get_window_extent(renderer).width for label in axes.get_xticklabels())
    assert dollar > 2 * plain
