"""Pictures of an evaluation for TensorBoard: confusion-matrix heatmap, grid of mistakes, PR curves.

    values = eval_summary_values(confusion, class_names, labels, probabilities, mistakes)  # Summary.Values

The caller writes tf.compat.v1.Summary(value=values) at the checkpoint's global step. Figures are drawn on
matplotlib.figure.Figure with the Agg canvas: pyplot's global state is never touched. Labels are class indices
into class_names; probabilities are [N, C] softmax outputs; a prediction is their argmax (ties: the first class).

Characters the default font lacks (Chinese, Japanese, Korean) come from an installed font that has them all
(fonts-noto-cjk); without one they are shown as Python escapes (\\u578b), and one line per process says so.
"""
import collections
import dataclasses
import functools
import io
import math
import os
import sys

from matplotlib import font_manager
from matplotlib import rcParams
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np
from PIL import Image
from tensorboard.plugins.pr_curve import summary as pr_curve_summary
import tensorflow as tf

CONFUSION_MATRIX_IMAGE_TAG = 'eval/confusion_matrix_image'  # eval/confusion_matrix is the text table
MISTAKES_TAG = 'eval/mistakes'
PR_CURVE_TAG_PREFIX = 'pr_curves/'
DEFAULT_NUM_THRESHOLDS = 201  # TensorBoard's own default
DPI = 100
GRID_COLUMNS = 5
TILE_SIZE_INCHES = (2.5, 3.0)  # width, height: the photo plus a caption of two or three lines
MAX_CAPTION_NAME = 30  # characters of a file name in a caption
MAX_CAPTION_LINE = 36  # characters a caption line holds at 8 points; longer: the predicted class on a third line
PNG_COLORSPACES = {'L': 1, 'LA': 2, 'RGB': 3, 'RGBA': 4}  # Summary.Image.colorspace
FONT_PACKAGE = 'fonts-noto-cjk'  # Debian's and Ubuntu's Noto CJK fonts: Chinese, Japanese and Korean
# Tried first for names the default font cannot draw: ONU models are named by Chinese vendors.
PREFERRED_FONTS = ('Noto Sans CJK SC', 'Noto Sans CJK TC', 'Noto Sans CJK HK', 'Noto Sans CJK JP',
                   'Noto Sans CJK KR')
# A glyph that stands for more code points is a placeholder, not a drawing: matplotlib's own Last Resort font
# maps all 1.1 million code points to 371 "missing" boxes. Real fonts share a glyph between at most a few.
MAX_CODE_POINTS_PER_GLYPH = 100
REGULAR_WEIGHT = 400


# Not compared by value: the image is an array, whose == is elementwise.
@dataclasses.dataclass(frozen=True, eq=False)
class Mistake:
    """One misclassified photo: labels are class indices, probability that of the predicted class."""
    filename: str
    image: np.ndarray  # uint8 [height, width, 3]
    true_label: int
    predicted_label: int
    probability: float

    @classmethod
    def from_prediction(cls, filename, image, true_label, probabilities):
        """Returns the Mistake of a photo whose class probabilities are probabilities ([C])."""
        predicted = int(np.argmax(probabilities))
        return cls(text(filename), image, int(true_label), predicted, float(probabilities[predicted]))


def text(name):
    """Returns a file name as str (TensorFlow hands them over as UTF-8 bytes)."""
    return name.decode('utf-8', 'replace') if isinstance(name, bytes) else str(name)


def _checked_predictions(filenames, labels, probabilities):
    """Returns (labels, probabilities, predicted) as arrays; ValueError unless their shapes agree."""
    labels = np.asarray(labels)
    probabilities = np.asarray(probabilities)
    if probabilities.ndim != 2 or labels.shape != probabilities.shape[:1] or len(filenames) != len(labels):
        raise ValueError(f'expected N file names, labels [N] and probabilities [N, C]; got '
                         f'{len(filenames)}, {labels.shape} and {probabilities.shape}')
    return labels, probabilities, np.argmax(probabilities, axis=1)


def select_mistakes(filenames, labels, probabilities, max_mistakes):
    """Returns the indices of at most max_mistakes misclassified examples, most confident first."""
    labels, probabilities, predicted = _checked_predictions(filenames, labels, probabilities)
    wrong = np.flatnonzero(predicted != labels)
    confidence = probabilities[wrong, predicted[wrong]]
    order = np.argsort(-confidence, kind='stable')  # stable: ties stay in file order
    return [int(index) for index in wrong[order][:max(max_mistakes, 0)]]


def misclassified(filenames, labels, probabilities):
    """Returns the file names of all misclassified examples, in file order."""
    labels, _, predicted = _checked_predictions(filenames, labels, probabilities)
    return [text(filenames[index]) for index in np.flatnonzero(predicted != labels)]


@functools.lru_cache(maxsize=None)
def _characters(family):
    """Returns the code points that the font matplotlib picks for family (a name or a generic family) draws."""
    path = font_manager.findfont(font_manager.FontProperties(family=[family]))  # a str would be a fontconfig pattern
    glyphs = font_manager.get_font(path).get_charmap()  # code point -> glyph index (0: none)
    shared = collections.Counter(glyphs.values())
    return frozenset(code for code, glyph in glyphs.items() if glyph and shared[glyph] <= MAX_CODE_POINTS_PER_GLYPH)


def _font_names():
    """Returns the names of the regular (upright, normal weight) fonts matplotlib knows, PREFERRED_FONTS first."""
    names = {entry.name for entry in font_manager.fontManager.ttflist if entry.style == 'normal'
             and font_manager.weight_dict.get(entry.weight, entry.weight) == REGULAR_WEIGHT}
    return sorted(names, key=lambda name: (PREFERRED_FONTS.index(name) if name in PREFERRED_FONTS
                                           else len(PREFERRED_FONTS), name))


def _add_new_system_fonts():
    """Adds the system's font files missing from matplotlib's font cache (built once); returns how many."""
    known = {entry.fname for entry in font_manager.fontManager.ttflist}
    added = 0
    for path in font_manager.findSystemFonts():
        if path in known:
            continue
        try:
            font_manager.fontManager.addfont(path)
            added += 1
        except (OSError, RuntimeError, ValueError):  # a file FreeType cannot read: matplotlib's own scan skips it too
            continue
    return added


def find_font_with(characters):
    """Returns the name of an installed font that has every one of characters (code points), None if none has."""
    name = next((name for name in _font_names() if characters <= _characters(name)), None)
    if name is None and _add_new_system_fonts():
        return find_font_with(characters)  # once more, with the fonts installed since matplotlib's cache was built
    return name


@dataclasses.dataclass(frozen=True)
class TextFont:
    """How a picture draws its texts: the font families (None: matplotlib's default) and the code points none has."""
    families: tuple = None
    missing: frozenset = frozenset()

    def shown(self, name):
        """Returns name as drawn: each character no font has as its Python escape (\\u578b), the rest as it is."""
        return ''.join(char.encode('unicode_escape').decode('ascii') if ord(char) in self.missing else char
                       for char in name)


_missing_font_reported = False


def _report_missing_font(name, font):
    """Says once per process that no installed font draws name, how it is shown instead, and how to get the font."""
    global _missing_font_reported  # pylint: disable=global-statement
    if _missing_font_reported:
        return
    _missing_font_reported = True
    print(f"warning: no installed font can draw the name '{name}': the eval pictures show it as "
          f"'{font.shown(name)}'; to draw Chinese, Japanese and Korean names, install {FONT_PACKAGE} "
          f"(apt-get install {FONT_PACKAGE})", file=sys.stderr, flush=True)


def text_font(names):
    """Returns the TextFont that draws names: the default font, plus an installed font for what it lacks."""
    default = tuple(rcParams['font.family'])
    needed = {ord(char) for name in names for char in name if char.isprintable()}
    missing = frozenset(needed.difference(*(_characters(family) for family in default)))
    if not missing:
        return TextFont()
    extra = find_font_with(missing)
    if extra is not None:
        return TextFont(default + (extra,))
    font = TextFont(missing=missing)
    _report_missing_font(next(name for name in names if font.shown(name) != name), font)
    return font


def figure_png(figure):
    """Returns the figure rendered as RGB PNG bytes, exactly figsize * dpi pixels."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    rgb = np.asarray(canvas.buffer_rgba())[..., :3]
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, 'PNG')
    return buffer.getvalue()


def confusion_matrix_png(confusion, class_names, title=None):
    """Returns confusion_matrix_figure's heatmap as PNG bytes."""
    return figure_png(confusion_matrix_figure(confusion, class_names, title))


def confusion_matrix_figure(confusion, class_names, title=None):
    """Returns a Figure: a heatmap of confusion[true, predicted] counts, coloured by the fraction of their row."""
    confusion = np.asarray(confusion)
    count = len(class_names)
    if confusion.shape != (count, count):
        raise ValueError(f'confusion matrix of shape {confusion.shape} for {count} class names')
    totals = confusion.sum(axis=1, keepdims=True)
    fractions = confusion / np.maximum(totals, 1)
    side = max(4.0, 1.5 + 0.55 * count)
    # 'compressed': with square cells, constrained layout misjudges the left margin and cuts off the y label.
    figure = Figure(figsize=(side + 1.0, side), dpi=DPI, layout='compressed')
    axes = figure.subplots()
    heatmap = axes.imshow(fractions, cmap='Blues', vmin=0.0, vmax=1.0)
    figure.colorbar(heatmap, ax=axes, shrink=0.8, label='fraction of the true class')
    font_size = min(12.0, max(6.0, 14.0 - 0.35 * count))
    for (true, predicted), value in np.ndenumerate(confusion):
        axes.text(predicted, true, str(value), ha='center', va='center', fontsize=font_size,
                  color='white' if fractions[true, predicted] > 0.5 else 'black')
    font = text_font(class_names)
    names = [font.shown(name) for name in class_names]
    rotate = count > 4 or max(len(name) for name in names) > 8
    axes.set_xticks(range(count), names, rotation=45 if rotate else 0,
                    ha='right' if rotate else 'center', rotation_mode='anchor', fontfamily=font.families)
    axes.set_yticks(range(count), names, fontfamily=font.families)
    axes.set_xlabel('predicted class')
    axes.set_ylabel('true class')
    axes.set_title(title or f'Confusion matrix ({int(confusion.sum())} examples)')
    return figure


def _short_name(filename):
    """Returns the file's base name, its middle elided if long (start and end stay recognisable)."""
    name = os.path.basename(text(filename))
    if len(name) <= MAX_CAPTION_NAME:
        return name
    keep = MAX_CAPTION_NAME - 3
    return name[:keep - keep // 2] + '...' + name[-(keep // 2):]


def mistake_caption(mistake, class_names, shown=str):
    """Returns a tile's caption: file name, then true -> predicted class and its probability; shown: TextFont.shown."""
    true = f'true {shown(class_names[mistake.true_label])}'
    predicted = f'-> {shown(class_names[mistake.predicted_label])} {mistake.probability:.2f}'
    between = ' ' if len(true) + 1 + len(predicted) <= MAX_CAPTION_LINE else '\n'
    return f'{_short_name(shown(text(mistake.filename)))}\n{true}{between}{predicted}'


def mistakes_grid_png(mistakes, class_names, max_mistakes):
    """Returns mistakes_grid_figure's grid as PNG bytes; None if there are no mistakes to show."""
    figure = mistakes_grid_figure(mistakes, class_names, max_mistakes)
    return None if figure is None else figure_png(figure)


def mistakes_grid_figure(mistakes, class_names, max_mistakes):
    """Returns a Figure: a grid of the first max_mistakes mistakes with captions; None if there are none."""
    shown = list(mistakes)[:max(max_mistakes, 0)]
    if not shown:
        return None
    columns = min(len(shown), GRID_COLUMNS)
    rows = math.ceil(len(shown) / columns)
    width, height = TILE_SIZE_INCHES
    figure = Figure(figsize=(columns * width, rows * height), dpi=DPI, layout='constrained')
    for axes in figure.subplots(rows, columns, squeeze=False).flat:
        axes.set_axis_off()
    font = text_font([*class_names, *(os.path.basename(text(mistake.filename)) for mistake in shown)])
    for axes, mistake in zip(figure.axes, shown):
        image = np.asarray(mistake.image)
        axes.imshow(image, cmap='gray' if image.ndim == 2 else None)
        axes.set_title(mistake_caption(mistake, class_names, font.shown), fontsize=8, fontfamily=font.families)
    return figure


def image_summary_value(tag, png_bytes):
    """Returns a Summary.Value holding the PNG image, its size and colour space read from the PNG."""
    with Image.open(io.BytesIO(png_bytes)) as image:  # reads the header only
        if image.format != 'PNG':
            raise ValueError(f'{tag}: expected PNG bytes, got {image.format}')
        width, height = image.size
        colorspace = PNG_COLORSPACES.get(image.mode, 3)
    return tf.compat.v1.Summary.Value(tag=tag, image=tf.compat.v1.Summary.Image(
        height=height, width=width, colorspace=colorspace, encoded_image_string=png_bytes))


def pr_curve_summary_values(labels, probabilities, class_names, num_thresholds=DEFAULT_NUM_THRESHOLDS):
    """Returns one-vs-rest precision-recall curves for the PR curves dashboard, tagged pr_curves/<class>."""
    labels = np.asarray(labels)
    # float32 softmax can exceed 1 by a rounding error; the plugin drops values above 1.
    probabilities = np.clip(np.asarray(probabilities, np.float64), 0.0, 1.0)
    if probabilities.shape != (len(labels), len(class_names)):
        raise ValueError(f'probabilities of shape {probabilities.shape} for {len(labels)} labels and '
                         f'{len(class_names)} classes')
    values = []
    for index, name in enumerate(class_names):
        curve = pr_curve_summary.pb(name, labels == index, probabilities[:, index],
                                    num_thresholds=num_thresholds, display_name=name,
                                    description=f'{name} against the other classes')
        value = curve.value[0]
        value.tag = PR_CURVE_TAG_PREFIX + name  # pb() would tag it <name>/pr_curves
        values.append(value)
    return values


def eval_summary_values(confusion, class_names, labels, probabilities, mistakes,
                        num_thresholds=DEFAULT_NUM_THRESHOLDS):
    """Returns the Summary.Values of one evaluation: confusion heatmap, grid of all mistakes (if any), PR curves."""
    values = [image_summary_value(CONFUSION_MATRIX_IMAGE_TAG, confusion_matrix_png(confusion, class_names))]
    grid = mistakes_grid_png(mistakes, class_names, len(mistakes))
    if grid is not None:
        values.append(image_summary_value(MISTAKES_TAG, grid))
    return values + pr_curve_summary_values(labels, probabilities, class_names, num_thresholds)
