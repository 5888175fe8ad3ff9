"""Tests of onu_lib/onu_known.py: the temperature and the known score fitted on val outputs, on synthetic numpy
outputs (no model, no TensorFlow): three classes of Gaussian features in three blocks, logits of a Gaussian classifier
of the pooled block, and far-away "outside" photos whose logits are flat. Every entry of SCORES is tested by
iterating the registry, so a new score is held to the same promises at once."""
import json

import numpy as np
import pytest

from onu_lib import onu_known

CLASSES = 3
BLOCKS = (('a/mean', 4), ('a/std', 3), ('b/mean', 6))  # b/mean is the last end point's: the pooled features
WIDTH = sum(size for _, size in BLOCKS)
_CONSTANTS = np.random.default_rng(0)
CENTRES = _CONSTANTS.normal(0, 2.5, (CLASSES, WIDTH))  # the class means, every block apart
MIXING = np.eye(WIDTH) + 0.3 * _CONSTANTS.normal(size=(WIDTH, WIDTH))  # one shared, correlated covariance
POOLED = onu_known.block_slices(BLOCKS)['b/mean']
OUTSIDE_SHIFT = 30.0  # far from every class, in every feature


def _val_like(rng, per_class):
    """(logits [N, C], features [N, D], labels [N]) of photos of the known classes: per_class of each."""
    labels = np.repeat(np.arange(CLASSES), per_class)
    features = CENTRES[labels] + rng.normal(size=(len(labels), WIDTH)) @ MIXING
    pooled = features[:, POOLED]
    logits = 0.3 * (pooled @ CENTRES[:, POOLED].T - 0.5 * (CENTRES[:, POOLED] ** 2).sum(axis=1))  # a linear classifier
    return logits, features, labels


def _outside(rng, count):
    """(logits, features) of photos that are no known class: features far away, logits flat and small."""
    features = OUTSIDE_SHIFT + rng.normal(size=(count, WIDTH)) @ MIXING
    return rng.normal(0, 0.1, (count, CLASSES)), features


def _nll(logits, labels, temperature):
    """The mean negative log-likelihood of labels under softmax(logits / temperature)."""
    probabilities = onu_known.softmax(logits, temperature)
    return float(-np.mean(np.log(probabilities[np.arange(len(labels)), labels])))


def _tempered(rng, count, temperature, classes=5):
    """(base logits z, labels drawn from softmax(z / temperature))."""
    z = rng.normal(0, 3, (count, classes))
    probabilities = onu_known.softmax(z, temperature)
    labels = (rng.random((count, 1)) > np.cumsum(probabilities, axis=1)).sum(axis=1)
    return z, labels


# ---------------------------------------------------------------------------------------------
# Temperature and calibration error

@pytest.mark.parametrize('true_temperature', [0.5, 2.0, 4.0])
def test_the_fitted_temperature_is_the_one_the_labels_were_drawn_with(true_temperature):
    z, labels = _tempered(np.random.default_rng(1), 6000, true_temperature)
    fitted = onu_known.fit_temperature(z, labels)
    assert abs(fitted / true_temperature - 1) < 0.15, (fitted, true_temperature)
    assert fitted in onu_known.TEMPERATURES
    assert _nll(z, labels, fitted) < _nll(z, labels, 1.0) - 0.01
    # What the temperature is for: the calibration error falls, to near none.
    after = onu_known.expected_calibration_error(onu_known.softmax(z, fitted), labels)
    assert after < 0.03 < onu_known.expected_calibration_error(onu_known.softmax(z), labels), after


def test_labels_drawn_from_the_softmax_itself_fit_a_temperature_near_one():
    z, labels = _tempered(np.random.default_rng(2), 6000, 1.0)
    assert 0.9 < onu_known.fit_temperature(z, labels) < 1.1


def test_a_calibrated_set_has_no_calibration_error():
    one_hot = np.eye(4)[[0, 1, 2, 3, 1, 0]]
    assert onu_known.expected_calibration_error(one_hot, [0, 1, 2, 3, 1, 0]) == 0.0
    # Ten photos at confidence 0.8, eight of them right.
    probabilities = np.tile([0.8, 0.2], (10, 1))
    assert onu_known.expected_calibration_error(probabilities, [0] * 8 + [1] * 2) == pytest.approx(0.0, abs=1e-12)
    # All confident and all wrong: an error of the full confidence.
    assert onu_known.expected_calibration_error(one_hot, [1, 2, 3, 0, 0, 1]) == 1.0


def test_the_calibration_error_weighs_each_confidence_bin_by_its_share():
    probabilities = [[0.95, 0.05], [0.95, 0.05], [0.35, 0.65], [0.75, 0.25]]
    labels = [0, 1, 1, 1]  # right, wrong, right, wrong
    # 15 bins: {0.95, 0.95} accuracy 1/2 -> 0.5 * 0.45; {0.65} right -> 0.25 * 0.35; {0.75} wrong -> 0.25 * 0.75.
    assert onu_known.expected_calibration_error(probabilities, labels) == pytest.approx(0.225 + 0.0875 + 0.1875)
    # One bin: accuracy 1/2 against the mean confidence 0.825.
    assert onu_known.expected_calibration_error(probabilities, labels, bins=1) == pytest.approx(0.325)


# ---------------------------------------------------------------------------------------------
# The known score and its threshold

@pytest.fixture(scope='module')
def val_outputs():
    """Val outputs of the known classes: 200 photos of each."""
    return _val_like(np.random.default_rng(3), 200)


@pytest.fixture(scope='module')
def calibrations(val_outputs):
    """{(score, known_recall): Calibration} of val_outputs, made when first asked for."""
    made = {}

    def calibration(score=onu_known.SERVED_SCORE, known_recall=onu_known.DEFAULT_KNOWN_RECALL):
        if (score, known_recall) not in made:
            made[score, known_recall] = onu_known.calibrate(*val_outputs, BLOCKS, known_recall=known_recall,
                                                            score=score)
        return made[score, known_recall]
    return calibration


@pytest.mark.parametrize('known_recall', [0.8, 0.95])
@pytest.mark.parametrize('score', onu_known.SCORE_NAMES)
def test_the_threshold_keeps_the_asked_share_of_val_and_of_new_photos_like_them(calibrations, score, known_recall):
    calibration = calibrations(score, known_recall)
    assert calibration.score == score and calibration.figures['known_recall'] == known_recall
    assert known_recall <= calibration.figures['val_known'] <= known_recall + 0.01, calibration.figures
    # Out of fold is how a new photo of a known class is scored: fresh photos of the val distribution.
    _, _, known = onu_known.known_of(*_val_like(np.random.default_rng(4), 350)[:2], calibration)
    assert abs(known.mean() - known_recall) < 0.06, (known.mean(), known_recall)


@pytest.mark.parametrize('score', onu_known.SCORE_NAMES)
def test_on_a_small_val_split_the_known_share_is_never_below_the_asked_one(score):
    """With 21 val photos the threshold cannot hit a share exactly: it keeps at least the share asked, at most
    two photos more."""
    outputs = _val_like(np.random.default_rng(15), 7)
    for known_recall in (0.5, 0.75, 0.9, 0.95, 0.99):
        val_known = onu_known.calibrate(*outputs, BLOCKS, known_recall=known_recall, score=score).figures['val_known']
        assert known_recall <= val_known <= known_recall + 2 / 21, (known_recall, val_known)


@pytest.mark.parametrize('score', onu_known.SCORE_NAMES)
def test_a_higher_known_recall_lowers_the_threshold(calibrations, score):
    assert calibrations(score, 0.99).threshold < calibrations(score, 0.95).threshold < calibrations(
        score, 0.8).threshold


@pytest.mark.parametrize('score', onu_known.SCORE_NAMES)
def test_every_score_is_higher_for_photos_of_the_known_classes_than_for_outside_ones(val_outputs, score):
    entry = onu_known.score_named(score)
    logits, features, labels = val_outputs
    params = entry.fit(logits, features, labels, BLOCKS)
    rng = np.random.default_rng(5)
    inside = entry.score(*_val_like(rng, 100)[:2], params, BLOCKS)
    outside = entry.score(*_outside(rng, 300), params, BLOCKS)
    assert inside.shape == (300,) and outside.shape == (300,)
    assert np.mean(inside) > np.mean(outside), (np.mean(inside), np.mean(outside))
    assert np.mean(outside < np.median(inside)) > 0.9, (np.median(inside), np.median(outside))


@pytest.mark.parametrize('score', ['layer_distance', 'pooled_distance'])
def test_far_away_photos_are_unknown_by_the_distances(calibrations, score):
    _, _, known = onu_known.known_of(*_outside(np.random.default_rng(6), 500), calibrations(score))
    assert known.mean() < 0.01


@pytest.mark.parametrize('block', [name for name, _ in BLOCKS])
def test_by_layer_distance_the_least_typical_layer_decides(calibrations, block):
    """Photos far off in one block and typical in the others: layer_distance, which reads every block, keeps none;
    pooled_distance, which reads only the pooled features (the last end point's means), keeps them as it keeps val
    photos unless the block is the pooled one."""
    rng = np.random.default_rng(7)
    logits, features, _ = _val_like(rng, 200)
    shifted = features.copy()
    shifted[:, onu_known.block_slices(BLOCKS)[block]] += OUTSIDE_SHIFT
    assert onu_known.known_of(logits, shifted, calibrations('layer_distance'))[2].mean() < 0.01
    pooled_known = onu_known.known_of(logits, shifted, calibrations('pooled_distance'))[2].mean()
    if block == 'b/mean':
        assert pooled_known < 0.01
    else:
        assert abs(pooled_known - 0.95) < 0.06, pooled_known
    # The far-off block alone sets the score: the other blocks of other typical photos change nothing.
    others = _val_like(rng, 200)[1]
    others[:, onu_known.block_slices(BLOCKS)[block]] = shifted[:, onu_known.block_slices(BLOCKS)[block]]
    _, score, _ = onu_known.known_of(logits, shifted, calibrations('layer_distance'))
    np.testing.assert_array_equal(onu_known.known_of(logits, others, calibrations('layer_distance'))[1], score)


def test_layer_distance_puts_every_block_on_one_scale_whatever_its_width():
    """Each block's score is standardized by the centre and scale of its out-of-fold scores, which is how new photos
    score: a block as wide as the val photos are few (in-sample distances would flatter it) is as typical for new
    photos as a narrow one, and each block is the least typical for about its share of them."""
    blocks = (('a/mean', 3), ('wide/std', 24), ('b/mean', 4))
    width = sum(size for _, size in blocks)
    centres = np.random.default_rng(0).normal(0, 2.5, (CLASSES, width))

    def photos(rng, per_class):
        labels = np.repeat(np.arange(CLASSES), per_class)
        return np.zeros((len(labels), CLASSES)), centres[labels] + rng.normal(size=(len(labels), width)), labels
    params = onu_known.calibrate(*photos(np.random.default_rng(1), 30), blocks).params
    features = photos(np.random.default_rng(2), 300)[1]
    standardized = np.stack([(onu_known.mahalanobis_nearest(features[:, columns], params[name]['means'],
                                                            params[name]['precision']) - params[name]['centre'])
                             / params[name]['scale'] for name, columns in onu_known.block_slices(blocks).items()])
    assert np.all(np.abs(standardized.mean(axis=1)) < 0.4), standardized.mean(axis=1)
    assert np.all(np.abs(standardized.std(axis=1) - 1) < 0.25), standardized.std(axis=1)
    deciding = np.bincount(standardized.argmin(axis=0), minlength=len(blocks)) / standardized.shape[1]
    assert np.all((deciding > 0.2) & (deciding < 0.5)), deciding


def test_known_is_exactly_the_score_at_or_above_the_threshold(calibrations):
    calibration = calibrations()
    rng = np.random.default_rng(8)
    val_logits, val_features, _ = _val_like(rng, 100)
    outside_logits, outside_features = _outside(rng, 100)
    logits, features = np.concatenate([val_logits, outside_logits]), np.concatenate([val_features, outside_features])
    probabilities, score, known = onu_known.known_of(logits, features, calibration)
    assert known.dtype == bool and np.array_equal(known, score >= calibration.threshold)
    assert known.any() and not known.all()
    np.testing.assert_allclose(probabilities, onu_known.softmax(logits, calibration.temperature))
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    # A photo scored at the threshold itself is known.
    at_threshold = onu_known.Calibration(**{**vars(calibration), 'threshold': float(score[0])})
    assert onu_known.known_of(logits[:1], features[:1], at_threshold)[2][0]


def test_overconfident_val_logits_get_a_temperature_above_one_that_lowers_the_calibration_error():
    z, labels = _tempered(np.random.default_rng(9), 1000, 3.0, classes=CLASSES)
    features = np.random.default_rng(10).normal(size=(len(labels), WIDTH))
    calibration = onu_known.calibrate(z, features, labels, BLOCKS, score='max_softmax')
    assert calibration.temperature == onu_known.fit_temperature(z, labels)
    assert 2.5 < calibration.temperature < 3.5
    figures = calibration.figures
    assert figures['ece_after'] < 0.05 < figures['ece_before'], figures
    assert figures['precision_all'] == pytest.approx(np.mean(z.argmax(axis=1) == labels))


def _random_outputs(counts, seed=11):
    """(logits, features, labels) of counts[c] photos of class c, random."""
    labels = np.repeat(np.arange(len(counts)), counts)
    rng = np.random.default_rng(seed)
    return rng.normal(size=(len(labels), len(counts))), rng.normal(size=(len(labels), WIDTH)), labels


@pytest.mark.parametrize('counts', [(5, 1, 5), (5, 0, 5), (5, 5, 0), (1, 1, 1)])  # (5, 5, 0): the last class
def test_a_class_with_fewer_than_two_val_photos_is_refused(counts):
    with pytest.raises(ValueError, match=f'^{min(counts)} val photos of a class'):
        onu_known.calibrate(*_random_outputs(counts), BLOCKS)


@pytest.mark.parametrize('score', onu_known.SCORE_NAMES)
def test_two_val_photos_of_a_class_are_enough(score):
    calibration = onu_known.calibrate(*_random_outputs((5, 2, 5)), BLOCKS, score=score)
    assert np.isfinite(calibration.threshold) and calibration.figures['val_examples'] == 12


def test_the_summary_is_the_json_of_everything_but_the_parameter_arrays(calibrations):
    calibration = calibrations()
    summary = calibration.summary()
    assert json.loads(json.dumps(summary)) == summary
    assert (summary['temperature'], summary['score'], summary['threshold']) == (
        calibration.temperature, calibration.score, calibration.threshold)
    assert {key: summary[key] for key in calibration.figures} == calibration.figures
    assert set(summary) == {'temperature', 'score', 'threshold'} | set(calibration.figures)
    assert {'known_recall', 'val_examples', 'val_known', 'precision_known', 'ece_before', 'ece_after'} <= set(summary)
    assert summary['val_examples'] == 600


# ---------------------------------------------------------------------------------------------
# Folds

@pytest.mark.parametrize('counts, folds', [((12, 7, 9), onu_known.FOLDS), ((12, 3, 9), 3), ((2, 8), 2)])
def test_every_class_is_dealt_over_every_fold(counts, folds):
    labels = np.random.default_rng(13).permutation(np.repeat(np.arange(len(counts)), counts))
    fold = onu_known.fold_of(labels)
    assert fold.shape == labels.shape and set(fold) == set(range(folds))
    for c, count in enumerate(counts):
        per_fold = np.bincount(fold[labels == c], minlength=folds)
        assert per_fold.min() >= 1 and per_fold.max() - per_fold.min() <= 1, (c, per_fold)
        assert per_fold.sum() == count


def test_out_of_fold_never_scores_a_photo_with_a_fit_that_saw_it():
    labels = np.random.default_rng(14).permutation(np.repeat(np.arange(3), (11, 6, 8)))
    saw = onu_known.out_of_fold(set, lambda seen, rows: [row in seen for row in rows], labels)
    assert saw.shape == (25,) and not saw.any()
    # Each fit sees all the other folds; the results come back in photo order.
    fold = onu_known.fold_of(labels)
    seen = onu_known.out_of_fold(len, lambda count, rows: np.full(len(rows), count), labels)
    np.testing.assert_array_equal(seen, [np.sum(fold != fold[row]) for row in range(25)])
    np.testing.assert_array_equal(onu_known.out_of_fold(set, lambda _, rows: rows, labels), np.arange(25))


def test_with_one_fold_the_fit_is_to_all_photos():
    labels = np.array([0, 0, 0, 1])
    assert onu_known.fold_of(labels).tolist() == [0, 0, 0, 0]
    np.testing.assert_array_equal(onu_known.out_of_fold(len, lambda count, rows: np.full(len(rows), count), labels),
                                  [4, 4, 4, 4])
