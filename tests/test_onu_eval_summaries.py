"""Tests of onu_eval_summaries.py: real PNGs, checked against independent computations, and a real
TensorBoard server that has to list and serve what was written."""
import io
import math
import os
import warnings

import matplotlib
from matplotlib import font_manager
from matplotlib import ft2font
from matplotlib.text import Text
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from onu_lib import onu_eval_summaries as summaries

CLASS_NAMES = ['F603', 'F663N']
STEP = 42


def decoded(png_bytes):
    """Returns the PNG as a PIL image, checking that it is one."""
    image = Image.open(io.BytesIO(png_bytes))
    assert image.format == 'PNG'
    image.load()
    return image


def random_predictions(count, num_classes, seed):
    """Returns (labels [N], probabilities [N, C]) with many exact ties (in argmax and in confidence)."""
    rng = np.random.default_rng(seed)
    weights = rng.integers(1, 5, (count, num_classes)).astype(np.float64)
    return rng.integers(0, num_classes, count), weights / weights.sum(axis=1, keepdims=True)


def expected_mistakes(labels, probabilities):
    """The misclassified indices, most confident first, by plain Python (first maximum on ties)."""
    wrong = []
    for index, (label, row) in enumerate(zip(labels.tolist(), probabilities.tolist())):
        predicted = row.index(max(row))
        if predicted != label:
            wrong.append((-row[predicted], index))
    return [index for _, index in sorted(wrong)]


def noise_image(height, width, seed):
    """Returns a random uint8 RGB photo stand-in."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def some_mistakes(count):
    """Returns count Mistakes of various photo sizes."""
    return [summaries.Mistake(f'/data/val/F603/F603_{i:04d}.jpg', noise_image(40 + 7 * i, 60, i), 0, 1, 0.9)
            for i in range(count)]


def colour_count(pixels):
    """Returns how many different RGB colours an [H, W, 3] uint8 image has."""
    return len(np.unique(pixels.reshape(-1, 3).astype(np.int32) @ np.array([65536, 256, 1])))


def some_confusion(num_classes, seed):
    """Returns a random confusion matrix with a heavy diagonal."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 30, (num_classes, num_classes)) + np.diag(rng.integers(50, 90, num_classes))


@pytest.mark.parametrize('num_classes', [2, 10, 20])
def test_confusion_png_is_an_rgb_picture(num_classes):
    names = CLASS_NAMES if num_classes == 2 else [f'ONU-{i:02d}' for i in range(num_classes)]
    image = decoded(summaries.confusion_matrix_png(some_confusion(num_classes, num_classes), names))
    assert image.mode == 'RGB' and min(image.size) >= 300
    assert colour_count(np.asarray(image)) > 50  # a heatmap with text, not a blank


def test_confusion_png_shows_the_counts_the_colours_and_the_names():
    names = ['F603', 'F663N', 'HG8245']
    confusion = some_confusion(3, 0)
    pixels = np.asarray(decoded(summaries.confusion_matrix_png(confusion, names, title='same')))
    # Doubling every count keeps each cell's colour (the fraction of its row): only the numbers differ.
    doubled = summaries.confusion_matrix_png(2 * confusion, names, title='same')
    transposed = summaries.confusion_matrix_png(confusion.T, names, title='same')
    renamed = summaries.confusion_matrix_png(confusion, [name + 'x' for name in names], title='same')
    for different in (doubled, transposed, renamed):
        different = np.asarray(decoded(different))
        assert different.shape == pixels.shape and not np.array_equal(different, pixels)


def rendered(figure):
    """Returns the figure's pixels as its PNG holds them ([H, W, 3] uint8); the figure keeps the renderer's layout."""
    return np.asarray(decoded(summaries.figure_png(figure)))


def heatmap_axes(figure):
    """Returns the heatmap's axes (the colour bar is the other one)."""
    [axes] = [axes for axes in figure.axes if axes.get_images()]
    return axes


def pixel_at(pixels, axes, x, y):
    """Returns the RGB pixel at data point (x, y) of axes (display y counts from the bottom, PNG rows from the top)."""
    column, row = axes.transData.transform((x, y))
    return pixels[int(round(pixels.shape[0] - row)), int(round(column))].astype(int)


def test_each_cell_is_coloured_by_its_share_of_the_true_class():
    # Shares of the row (true class) and of the column differ strongly here: [1, 0] is 0.1 of its row, 0.01 of its
    # column; [0, 1] 0.1 of its row, 0.56 of its column.
    confusion = np.array([[90, 10, 0], [1, 8, 1], [2, 0, 18]])
    figure = summaries.confusion_matrix_figure(confusion, ['F603', 'F663N', 'HG8245'])
    pixels = rendered(figure)
    axes = heatmap_axes(figure)
    blues = matplotlib.colormaps['Blues']  # vmin 0, vmax 1
    for (true, predicted), share in np.ndenumerate(confusion / confusion.sum(axis=1, keepdims=True)):
        # 0.3 of a cell from its centre: inside the cell, clear of the count written at the centre.
        colour = pixel_at(pixels, axes, predicted + 0.3, true + 0.3)
        expected = np.round(np.array(blues(share)[:3]) * 255).astype(int)
        assert np.abs(colour - expected).max() <= 2, (true, predicted, colour, expected)


def extent_in_pixels(artist, figure):
    """Returns an artist's (left, top, right, bottom) in PNG pixels (rows from the top) after figure_png."""
    box = artist.get_window_extent(figure.canvas.get_renderer())
    height = figure.bbox.height
    return box.x0, height - box.y1, box.x1, height - box.y0


def lies_inside(box, width, height):
    """Returns True when the (left, top, right, bottom) box lies within a width x height picture."""
    left, top, right, bottom = box
    return 0 <= left and right <= width and 0 <= top and bottom <= height


@pytest.mark.parametrize('names', [['F603', 'F663N'], ['F603', 'HG8245'], ['F603', 'F663N', 'GM220-S'],
                                   ['F603', 'HG8245H5-ONU-model'], [f'ONU-{i:02d}' for i in range(12)]],
                         ids=['2', '2-longer', '3-longer', '2-long-rotated', '12'])
def test_every_text_of_the_heatmap_lies_inside_the_picture(names):
    figure = summaries.confusion_matrix_figure(some_confusion(len(names), 0), names)
    pixels = rendered(figure)
    height, width = pixels.shape[:2]
    texts = [text for text in figure.findobj(Text) if text.get_visible() and text.get_text()]
    shown = {text.get_text() for text in texts}
    assert {'true class', 'predicted class', 'fraction of the true class', *names} <= shown
    boxes = [(text.get_text(), extent_in_pixels(text, figure)) for text in texts]
    assert [(text, box) for text, box in boxes if not lies_inside(box, width, height)] == []
    # Nothing is cut at the picture's edges: its outermost rows and columns are background.
    assert (pixels[[0, -1]] == 255).all() and (pixels[:, [0, -1]] == 255).all()


# ---------------------------------------------------------------------------------------------
# Class names in Chinese: a font that draws them, or readable escapes and one line


def has_chinese(path):
    """Returns True when the font file's first face has glyphs for 型 and 号."""
    try:
        characters = ft2font.FT2Font(path).get_charmap()
    except (OSError, RuntimeError):  # not a font FreeType reads
        return False
    return all(ord(char) in characters for char in '型号')


@pytest.fixture(scope='module')
def chinese_font_files():
    """The system's font files that draw Chinese (fonts-noto-cjk's), found without the code under test; else skips."""
    files = [path for path in font_manager.findSystemFonts() if has_chinese(path)]
    if not files:
        pytest.skip('no installed font draws Chinese: install fonts-noto-cjk (.ci/run does)')
    return files


def box_pixels(pixels, box):
    """Returns the pixels within box (left, top, right, bottom), widened to whole pixels."""
    left, top, right, bottom = box
    return pixels[max(math.floor(top), 0):math.ceil(bottom), max(math.floor(left), 0):math.ceil(right)]


def drawn_in_the_default_font(figure, texts):
    """Returns the figure's pixels again with texts in matplotlib's default font (DejaVu Sans), nothing moved."""
    figure.set_layout_engine('none')  # every position stays where the first rendering put it
    for text in texts:
        text.set_fontfamily(None)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # its "Glyph ... missing from font(s)"
        return rendered(figure)


def differing_share(first, second):
    """Returns the share of pixels that differ between two equally sized RGB images."""
    return (first != second).any(axis=2).mean()


def test_chinese_class_names_are_drawn_in_a_font_that_has_them(chinese_font_files):
    names = ['型号 A', 'F603']
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # matplotlib warns "Glyph ... missing from font(s)" per missing glyph
        figure = summaries.confusion_matrix_figure(np.array([[5, 1], [2, 6]]), names)
        pixels = rendered(figure)
        mistake = summaries.Mistake('型号A_0001.jpg', noise_image(30, 40, 0), 0, 1, 0.9)
        grid = summaries.mistakes_grid_figure([mistake], names, 1)
        grid_pixels = rendered(grid)
    axes = heatmap_axes(figure)
    labels = [axes.get_yticklabels()[0], axes.get_xticklabels()[0]]
    assert [label.get_text() for label in labels] == ['型号 A', '型号 A']
    [title] = [axes.title for axes in grid.axes]
    assert title.get_text() == '型号A_0001.jpg\ntrue 型号 A -> F603 0.90'
    # Drawn by DejaVu Sans, the same place shows "missing glyph" boxes instead.
    boxes = [extent_in_pixels(label, figure) for label in labels]
    in_default_font = drawn_in_the_default_font(figure, labels)
    shares = [differing_share(box_pixels(pixels, box), box_pixels(in_default_font, box)) for box in boxes]
    assert min(shares) > 0.2, shares  # 0.64 and 0.67 measured; 0 when both are boxes
    box = extent_in_pixels(title, grid)
    in_default_font = drawn_in_the_default_font(grid, [title])
    share = differing_share(box_pixels(grid_pixels, box), box_pixels(in_default_font, box))
    assert share > 0.1, share  # 0.41 measured (the caption's ASCII is the same in both)


def shipped_font_entries():
    """Returns matplotlib's font-list entries for the fonts it ships (its mpl-data), read from the files themselves."""
    paths = font_manager.findSystemFonts(fontpaths=[os.path.join(matplotlib.get_data_path(), 'fonts', 'ttf')])
    return [font_manager.ttfFontProperty(font_manager.get_font(path)) for path in sorted(paths)]


def test_a_chinese_font_installed_after_matplotlibs_font_cache_is_found(chinese_font_files, monkeypatch):
    # matplotlib lists the fonts once, in its cache; apt-get install fonts-noto-cjk may come after that. Here the
    # list holds only the fonts matplotlib ships, among them Last Resort, whose "missing" boxes claim every character.
    # The list is made here, not filtered from the user's cache: that cache may be another installation's.
    shipped = shipped_font_entries()
    assert 'Last Resort High-Efficiency' in {entry.name for entry in shipped}
    monkeypatch.setattr(font_manager.fontManager, 'ttflist', shipped)
    name = summaries.find_font_with(frozenset(map(ord, '型号')))
    assert name is not None
    assert str(font_manager.findfont(font_manager.FontProperties(family=[name]))) in chinese_font_files


ESCAPED = '\\u578b\\u53f7 A'  # 型号 A as shown without a font for it


def test_without_a_font_for_them_names_are_shown_escaped_and_said_once(monkeypatch, capsys):
    monkeypatch.setattr(summaries, 'find_font_with', lambda characters: None)  # no font draws Chinese
    monkeypatch.setattr(summaries, '_missing_font_reported', False)
    names = ['型号 A', 'F603']
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no "Glyph ... missing from font(s)" warnings
        figure = summaries.confusion_matrix_figure(np.array([[5, 1], [2, 6]]), names)
        rendered(figure)
        mistake = summaries.Mistake('/data/val/型号 A/型号A_0001.jpg', noise_image(30, 40, 0), 0, 1, 0.9)
        grid = summaries.mistakes_grid_figure([mistake], names, 1)
        rendered(grid)
    axes = heatmap_axes(figure)
    assert [label.get_text() for label in axes.get_yticklabels()] == [ESCAPED, 'F603']
    assert [label.get_text() for label in axes.get_xticklabels()] == [ESCAPED, 'F603']
    assert grid.axes[0].get_title() == f'\\u578b\\u53f7A_0001.jpg\ntrue {ESCAPED} -> F603 0.90'
    assert capsys.readouterr().err.splitlines() == [
        f"warning: no installed font can draw the name '型号 A': the eval pictures show it as '{ESCAPED}'; "
        "to draw Chinese, Japanese and Korean names, install fonts-noto-cjk (apt-get install fonts-noto-cjk)"]


def test_confusion_png_refuses_a_matrix_of_other_classes():
    with pytest.raises(ValueError, match='shape'):
        summaries.confusion_matrix_png(np.ones((3, 3), int), CLASS_NAMES)


def test_select_mistakes_and_misclassified_match_an_independent_computation():
    labels, probabilities = random_predictions(300, 4, seed=1)
    filenames = [f'img_{i:03d}.jpg'.encode() for i in range(len(labels))]  # bytes, as TensorFlow gives them
    expected = expected_mistakes(labels, probabilities)
    assert 30 < len(expected) < len(labels)

    assert summaries.select_mistakes(filenames, labels, probabilities, len(labels)) == expected
    assert summaries.select_mistakes(filenames, labels, probabilities, 10) == expected[:10]
    assert summaries.select_mistakes(filenames, labels, probabilities, 0) == []
    assert summaries.misclassified(filenames, labels, probabilities) == [
        f'img_{i:03d}.jpg' for i in sorted(expected)]


def test_select_mistakes_puts_the_most_confident_first_and_ties_in_file_order():
    probabilities = np.array([[0.6, 0.4], [0.3, 0.7], [0.1, 0.9], [0.3, 0.7], [0.2, 0.8]])
    labels = np.array([0, 0, 0, 0, 1])
    names = ['a.jpg', 'b.jpg', 'c.jpg', 'd.jpg', 'e.jpg']
    assert summaries.select_mistakes(names, labels, probabilities, 5) == [2, 1, 3]
    assert summaries.misclassified(names, labels, probabilities) == ['b.jpg', 'c.jpg', 'd.jpg']
    with pytest.raises(ValueError, match='probabilities'):
        summaries.select_mistakes(names[:4], labels, probabilities, 5)


def test_no_mistakes_no_grid():
    labels = np.array([0, 1, 1])
    probabilities = np.eye(2)[labels] * 0.8 + 0.1
    assert summaries.select_mistakes(['a', 'b', 'c'], labels, probabilities, 10) == []
    assert summaries.misclassified(['a', 'b', 'c'], labels, probabilities) == []
    assert summaries.mistakes_grid_png([], CLASS_NAMES, 10) is None
    assert summaries.mistakes_grid_png(some_mistakes(2), CLASS_NAMES, 0) is None


@pytest.mark.parametrize('count, max_mistakes', [(1, 16), (3, 16), (5, 16), (7, 16), (12, 16), (12, 7)])
def test_grid_has_a_tile_per_shown_mistake(count, max_mistakes):
    tile_width, tile_height = (round(inches * summaries.DPI) for inches in summaries.TILE_SIZE_INCHES)
    shown = min(count, max_mistakes)
    columns = min(shown, summaries.GRID_COLUMNS)
    image = decoded(summaries.mistakes_grid_png(some_mistakes(count), CLASS_NAMES, max_mistakes))
    assert image.mode == 'RGB'
    assert image.size == (columns * tile_width, math.ceil(shown / columns) * tile_height)


def test_grid_draws_the_photos_and_takes_grayscale():
    red = summaries.Mistake('red.jpg', np.full((50, 50, 3), (255, 0, 0), np.uint8), 0, 1, 0.7)
    gray = summaries.Mistake('gray.jpg', np.full((50, 50), 128, np.uint8), 1, 0, 0.6)
    pixels = np.asarray(decoded(summaries.mistakes_grid_png([red, gray], CLASS_NAMES, 2))).reshape(-1, 3)
    assert np.all(pixels == (255, 0, 0), axis=1).sum() > 1000


def test_caption_names_the_file_the_classes_and_the_probability():
    mistake = summaries.Mistake.from_prediction(b'/data/val/F603/F603_0012.jpg', noise_image(8, 8, 0), 0,
                                                np.array([0.13, 0.87], np.float32))
    assert (mistake.true_label, mistake.predicted_label) == (0, 1)
    np.testing.assert_array_equal(mistake.image, noise_image(8, 8, 0))
    assert summaries.mistake_caption(mistake, CLASS_NAMES) == 'F603_0012.jpg\ntrue F603 -> F663N 0.87'

    long_name = 'IMG_20240101_123456789_front_side_of_the_unit_F603.jpg'
    caption = summaries.mistake_caption(summaries.Mistake('/x/' + long_name, None, 1, 0, 0.5), CLASS_NAMES)
    shown = caption.split('\n')[0]
    assert len(shown) <= summaries.MAX_CAPTION_NAME
    assert shown.startswith('IMG_2024') and shown.endswith('_F603.jpg') and '...' in shown

    # Classes too long for the tile's width: the predicted one goes on a third line.
    caption = summaries.mistake_caption(mistake, ['HG8245H5-ONU-model', 'ZXHN F663N'])
    assert caption == 'F603_0012.jpg\ntrue HG8245H5-ONU-model\n-> ZXHN F663N 0.87'


def test_image_summary_value_reads_the_size_from_the_png():
    png = summaries.confusion_matrix_png(np.array([[3, 1], [0, 4]]), CLASS_NAMES)
    value = summaries.image_summary_value('eval/confusion_matrix_image', png)
    assert value.tag == 'eval/confusion_matrix_image'
    assert (value.image.width, value.image.height) == decoded(png).size
    assert value.image.colorspace == 3 and value.image.encoded_image_string == png

    jpeg = io.BytesIO()
    Image.fromarray(noise_image(8, 8, 0)).save(jpeg, 'JPEG')
    with pytest.raises(ValueError, match='PNG'):
        summaries.image_summary_value('x', jpeg.getvalue())


def expected_counts(is_class, scores, num_thresholds):
    """(true positives, false positives) at each threshold i / (n - 1): score >= threshold is positive."""
    thresholds = np.arange(num_thresholds) / (num_thresholds - 1)
    positive = scores[None, :] >= thresholds[:, None]
    return (positive & is_class).sum(axis=1), (positive & ~is_class).sum(axis=1)


def test_pr_curves_are_one_vs_rest_per_class():
    names = ['F603', 'F663N', 'HG8245']
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, 60)
    probabilities = rng.dirichlet(np.ones(3), 60).astype(np.float32)
    values = summaries.pr_curve_summary_values(labels, probabilities, names, num_thresholds=11)

    assert [value.tag for value in values] == ['pr_curves/' + name for name in names]
    for index, value in enumerate(values):
        assert value.metadata.plugin_data.plugin_name == 'pr_curves'
        assert (value.metadata.display_name, value.metadata.summary_description) == (
            names[index], f'{names[index]} against the other classes')
        data = tf.make_ndarray(value.tensor)  # rows: TP, FP, TN, FN, precision, recall
        assert data.shape == (6, 11)
        true_positives, false_positives = expected_counts(labels == index, probabilities[:, index], 11)
        np.testing.assert_array_equal(data[0], true_positives)
        np.testing.assert_array_equal(data[1], false_positives)
        np.testing.assert_array_equal(data[0] + data[3], np.sum(labels == index))
        assert data[5, 0] == 1.0  # everything is positive at threshold 0


@pytest.mark.script
def test_tensorboard_lists_and_serves_the_pictures_and_pr_curves(tmp_path, tensorboard_server):
    names = ['F603', 'F663N', 'HG8245']
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 3, 40)
    probabilities = rng.dirichlet(np.ones(3), 40)
    filenames = [f'{names[label]}_{i:04d}.jpg' for i, label in enumerate(labels)]
    confusion = np.zeros((3, 3), int)
    np.add.at(confusion, (labels, probabilities.argmax(axis=1)), 1)
    mistakes = [summaries.Mistake.from_prediction(filenames[i], noise_image(30, 40, i), labels[i], probabilities[i])
                for i in summaries.select_mistakes(filenames, labels, probabilities, 6)]
    values = summaries.eval_summary_values(confusion, names, labels, probabilities, mistakes, num_thresholds=21)
    with tf.Graph().as_default():  # v1 FileWriters refuse eager mode
        writer = tf.compat.v1.summary.FileWriter(str(tmp_path / 'logs' / 'eval'))
    writer.add_summary(tf.compat.v1.Summary(value=values), STEP)
    writer.close()

    server = tensorboard_server(logdir=tmp_path / 'logs')
    image_tags = [summaries.CONFUSION_MATRIX_IMAGE_TAG, summaries.MISTAKES_TAG]
    server.wait_for_tags('images', 'eval', image_tags)
    pr_tags = server.wait_for_tags('pr_curves', 'eval', ['pr_curves/' + name for name in names])
    assert sorted(pr_tags) == sorted('pr_curves/' + name for name in names)
    assert server.get_json('/data/plugins_listing')['pr_curves']['enabled']

    # The images TensorBoard serves are the PNGs that were written.
    written = {value.tag: value.image.encoded_image_string for value in values if value.HasField('image')}
    for tag in image_tags:
        [entry] = server.get_json('/data/plugin/images/images', run='eval', tag=tag)
        assert entry['step'] == STEP
        assert server.get_bytes('/data/plugin/images/individualImage?' + entry['query']) == written[tag]

    for index, name in enumerate(names):
        [curve] = server.get_json('/data/plugin/pr_curves/pr_curves', run='eval', tag='pr_curves/' + name)['eval']
        assert curve['step'] == STEP
        assert curve['thresholds'][0] == 0.0 and curve['recall'][0] == 1.0
        positives = int(np.sum(labels == index))
        assert curve['true_positives'][0] == positives
        assert curve['false_positives'][0] == len(labels) - positives
        assert curve['precision'][0] == pytest.approx(positives / len(labels))
        # TensorBoard drops the trailing thresholds where nothing is predicted positive.
        true_positives, false_positives = expected_counts(labels == index, probabilities[:, index], 21)
        shown = len(curve['true_positives'])
        assert curve['true_positives'] == true_positives[:shown].tolist()
        assert curve['false_positives'] == false_positives[:shown].tolist()
        assert np.all(true_positives[shown:] + false_positives[shown:] == 0)
