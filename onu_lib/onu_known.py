"""Whether a photo shows an ONU the model knows, and probabilities that mean what they say: both fitted on val.

A classifier names one of its classes for any photo. calibrate() fits, on the val split's outputs (never the train
split's, which the model has seen):
  a temperature T: probabilities softmax(logits / T), T chosen for the least negative log-likelihood (Guo et al. 2017);
  a known score, higher for photos more like the val photos, and its threshold: known = score >= threshold, set so
    that a share known_recall of the val photos is known. The share is measured out of fold (each photo scored by a
    fit to the others), the way a new photo of a known class is scored.
The scores are SCORES; the served one is SERVED_SCORE: the distance of the photo's activation statistics (per channel
mean, spread and maximum of each end point of ModelSpec.known_end_points) to the val photos of the nearest class
(Mahalanobis, shared covariance; Lee et al. 2018), layer by layer; the least typical layer decides.

No TensorFlow here: the serving graph computes the served score with onu_serving.known_outputs, and onu_predict.py
with known_of() for a TensorFlow Lite model. The outputs a score reads: logits [N, classes] and features [N, D], D the
sum of the sizes of blocks ((name, size) in order: model_features' layout).
"""
import dataclasses

import numpy as np

DEFAULT_KNOWN_RECALL = 0.95
FOLDS = 5  # out-of-fold scoring: each val photo scored by a fit to the others' four fifths
SHRINKAGE = 0.3  # of each covariance towards its mean variance: a few hundred photos fit a 256-wide block
ECE_BINS = 15
TEMPERATURES = np.exp(np.linspace(np.log(0.05), np.log(20.0), 601))  # the grid T is chosen from (1.0 among them)


def softmax(logits, temperature=1.0):
    """Softmax of logits / temperature over the last axis, float64."""
    scaled = np.asarray(logits, np.float64) / temperature
    exponentials = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


def _log_sum_exp(logits):
    """log(sum(exp(logits))) over the last axis."""
    logits = np.asarray(logits, np.float64)
    top = logits.max(axis=-1)
    return top + np.log(np.exp(logits - top[..., None]).sum(axis=-1))


def fit_temperature(logits, labels):
    """The temperature of TEMPERATURES whose softmax gives the labels the least negative log-likelihood."""
    logits, labels = np.asarray(logits, np.float64), np.asarray(labels)
    true_logits = logits[np.arange(len(labels)), labels]
    nll = [np.mean(_log_sum_exp(logits / t) - true_logits / t) for t in TEMPERATURES]
    return float(TEMPERATURES[int(np.argmin(nll))])


def expected_calibration_error(probabilities, labels, bins=ECE_BINS):
    """The top-label expected calibration error: |accuracy - confidence| of equal-width confidence bins, weighted by
    their share of the photos."""
    probabilities = np.asarray(probabilities, np.float64)
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == np.asarray(labels)
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    error = 0.0
    for index in range(bins):
        members = which == index
        if members.any():
            error += members.mean() * abs(correct[members].mean() - confidence[members].mean())
    return float(error)


# ---------------------------------------------------------------------------------------------
# The scores: higher means more like the val photos of the known classes

def _mahalanobis_fit(features, labels):
    """Class means [C, d] and the shrunk inverse of the shared within-class covariance [d, d]."""
    classes = int(labels.max()) + 1
    means = np.stack([features[labels == c].mean(axis=0) if np.any(labels == c) else features.mean(axis=0)
                      for c in range(classes)])
    centred = features - means[labels]
    covariance = centred.T @ centred / len(features)
    covariance = (1 - SHRINKAGE) * covariance + SHRINKAGE * (
        np.trace(covariance) / len(covariance) + 1e-6) * np.eye(len(covariance))
    return {'means': means, 'precision': np.linalg.inv(covariance)}


def mahalanobis_nearest(features, means, precision):
    """Minus the squared Mahalanobis distance of each row of features to the nearest class mean."""
    distances = [np.einsum('nd,de,ne->n', features - mean, precision, features - mean) for mean in means]
    return -np.min(distances, axis=0)


def block_slices(blocks):
    """{name: slice of the feature columns} of blocks ((name, size) in order)."""
    slices, start = {}, 0
    for name, size in blocks:
        slices[name] = slice(start, start + size)
        start += size
    return slices


def _layers_out_of_fold(logits, features, labels, blocks):
    """(out-of-fold layer_distance of each photo, its parameters): per block the Mahalanobis fit to all photos and the
    centre and scale of the block's out-of-fold scores (to compare blocks); the out-of-fold score is the least
    typical block's, standardized by those."""
    del logits
    params, standardized = {}, []
    for name, columns in block_slices(blocks).items():
        block = features[:, columns]
        raw = out_of_fold(lambda rows: _mahalanobis_fit(block[rows], labels[rows]),
                          lambda fit, rows: mahalanobis_nearest(block[rows], **fit), labels)
        params[name] = {**_mahalanobis_fit(block, labels), 'centre': float(np.mean(raw)),
                        'scale': float(np.std(raw) + 1e-6)}
        standardized.append((raw - params[name]['centre']) / params[name]['scale'])
    return np.min(standardized, axis=0), params


def _score_layers(logits, features, params, blocks):
    """The least typical block's standardized score."""
    del logits
    standardized = [(mahalanobis_nearest(features[:, columns], params[name]['means'], params[name]['precision'])
                     - params[name]['centre']) / params[name]['scale']
                    for name, columns in block_slices(blocks).items()]
    return np.min(standardized, axis=0)


def _last_end_point(blocks):
    """The columns of the last end point's channel means: the pooled features the classifier reads."""
    names = [name for name, _ in blocks if name.endswith('/mean')]
    return block_slices(blocks)[names[-1]]


@dataclasses.dataclass(frozen=True)
class Score:
    """A known score: fit(logits, features, labels, blocks) -> params; score(logits, features, params, blocks) -> [N].
    out_of_fold(logits, features, labels, blocks) -> (each photo's score by a fit to the other folds, fit's params),
    when the score computes it cheaper than calibrate's refit per fold."""
    name: str
    fit: object
    score: object
    description: str
    out_of_fold: object = None


SCORES = (
    Score('max_softmax', lambda *_: {}, lambda logits, features, params, blocks: softmax(logits).max(axis=1),
          'the largest probability (Hendrycks and Gimpel 2017)'),
    Score('energy', lambda *_: {}, lambda logits, features, params, blocks: _log_sum_exp(logits),
          'log-sum-exp of the logits (Liu et al. 2020)'),
    Score('pooled_distance',
          lambda logits, features, labels, blocks: _mahalanobis_fit(features[:, _last_end_point(blocks)], labels),
          lambda logits, features, params, blocks: mahalanobis_nearest(features[:, _last_end_point(blocks)], **params),
          'Mahalanobis distance of the pooled features to the nearest class (Lee et al. 2018)'),
    Score('layer_distance', lambda *outputs: _layers_out_of_fold(*outputs)[1], _score_layers,
          'the same, for the mean, spread and maximum of every end point; the least typical decides',
          out_of_fold=_layers_out_of_fold),
)
SCORE_NAMES = tuple(score.name for score in SCORES)
SERVED_SCORE = 'layer_distance'


def score_named(name):
    """The SCORES entry called name."""
    return SCORES[SCORE_NAMES.index(name)]


def fold_of(labels, folds=FOLDS):
    """Each photo's fold: the photos of each class dealt in turn, at most one fold per photo of the rarest class."""
    labels = np.asarray(labels)
    count = min(folds, min(int(np.sum(labels == c)) for c in np.unique(labels)))
    fold = np.zeros(len(labels), int)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        fold[members] = np.arange(len(members)) % max(count, 1)
    return fold


def out_of_fold(fit, apply, labels):
    """apply(fit(rows of the other folds), rows of a fold) for every fold, in photo order (fit to all when there is
    one fold); fit(rows) and apply(fitted, rows) take index arrays."""
    fold = fold_of(labels)
    result = None
    for index in np.unique(fold):
        held_out = np.flatnonzero(fold == index)
        others = np.flatnonzero(fold != index) if fold.max() > 0 else held_out
        values = np.asarray(apply(fit(others), held_out), np.float64)
        if result is None:
            result = np.zeros((len(labels),) + values.shape[1:])
        result[held_out] = values
    return result


@dataclasses.dataclass
class Calibration:
    """What calibrate() fitted: the temperature, the score's name, parameters and threshold, and the val figures."""
    temperature: float
    score: str
    threshold: float
    params: dict
    blocks: tuple
    figures: dict  # known_recall asked, val_examples, val_known (out of fold), precision_known, ece_before, ...

    def summary(self):
        """What an export's metadata records: everything but the parameter arrays."""
        return {'temperature': self.temperature, 'score': self.score, 'threshold': self.threshold, **self.figures}


def calibrate(logits, features, labels, blocks, known_recall=DEFAULT_KNOWN_RECALL, score=SERVED_SCORE):
    """Fits the temperature and the known score on val outputs; returns a Calibration. ValueError when a class has
    fewer than 2 val photos (nothing to score a photo of it against)."""
    logits, features, labels = np.asarray(logits, np.float64), np.asarray(features, np.float64), np.asarray(labels)
    counts = np.bincount(labels, minlength=logits.shape[1])
    if counts.min() < 2:
        raise ValueError(f'{int(counts.min())} val photos of a class: the known score needs at least 2 of each')
    entry = score_named(score)
    if entry.out_of_fold:
        oof_scores, params = entry.out_of_fold(logits, features, labels, blocks)
    else:
        oof_scores = out_of_fold(lambda rows: entry.fit(logits[rows], features[rows], labels[rows], blocks),
                                 lambda fitted, rows: entry.score(logits[rows], features[rows], fitted, blocks), labels)
        params = entry.fit(logits, features, labels, blocks)
    threshold = float(np.quantile(oof_scores, 1 - known_recall, method='lower'))
    oof_probabilities = out_of_fold(lambda rows: fit_temperature(logits[rows], labels[rows]),
                                    lambda temperature, rows: softmax(logits[rows], temperature), labels)
    known = oof_scores >= threshold
    correct = logits.argmax(axis=1) == labels
    figures = {
        'known_recall': known_recall,
        'val_examples': int(len(labels)),
        'val_known': float(known.mean()),
        'precision_known': float(correct[known].mean()) if known.any() else None,
        'precision_all': float(correct.mean()),
        'ece_before': expected_calibration_error(softmax(logits), labels),
        'ece_after': expected_calibration_error(oof_probabilities, labels),
    }
    return Calibration(temperature=fit_temperature(logits, labels), score=score, threshold=threshold,
                       params=params, blocks=tuple(blocks), figures=figures)


def known_of(logits, features, calibration):
    """(calibrated probabilities [N, C], known_score [N], known [N] bool) of outputs, by a Calibration."""
    score = score_named(calibration.score).score(np.asarray(logits, np.float64), np.asarray(features, np.float64),
                                                 calibration.params, calibration.blocks)
    return softmax(logits, calibration.temperature), score, score >= calibration.threshold
