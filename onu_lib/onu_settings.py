"""A setting declared once: setting() is a dataclass field that is also the declaration of the setting's flag (its
absl kind, default, help and checks, and how a run reads its value into the field); onu_flags declares the flags from
the fields and reads them back. No TensorFlow here: the data scripts, which never load it, take SharedSettings.
"""
import dataclasses
from typing import Callable

from onu_lib import onu_dataset

DEFAULT_TRAIN_DIR = '/tmp/onu_train'  # --train_dir's, the run the scripts after training read by default


@dataclasses.dataclass(frozen=True)
class Flag:
    """A setting's flag: absl's DEFINE_<kind>(name, default, help=help, **arguments) and its reading."""
    kind: str                 # string, integer, float, boolean, enum or list
    default: object
    help: str
    arguments: dict           # DEFINE_<kind>'s checks: lower_bound, upper_bound, enum_values
    read: Callable = None     # the flag's value (not None; a list as a tuple) -> the field's, where they differ
    validator: tuple = None   # (check, message) of flags.register_validator


# pragma: no mutate start (runs as the settings classes are defined, at import)
def setting(kind, default, help_text, read=None, validator=None, **arguments):
    """Returns a dataclass field declaring its flag (see Flag): the field's name is the flag's."""
    return dataclasses.field(metadata={'flag': Flag(kind, default, help_text, arguments, read, validator)})
# pragma: no mutate end


def flag_of(field):
    """Returns the Flag a dataclass field declares, or None for a field that is not a setting."""
    return field.metadata.get('flag')


@dataclasses.dataclass(frozen=True)
class SharedSettings:
    """The settings the data scripts (make_sample_data.py, convert_to_tfrecord.py) share with training."""
    data_dir: str = setting(
        'string', onu_dataset.DEFAULT_DATA_DIR,
        'Folder with the data: photos in train/<class>/ and val/<class>/ or in <class>/ folders (split by '
        '--validation_percent), this repo\'s records, or records written by the study, TF-slim, the Inception/ImageNet '
        'converters or TFDS.')
    validation_percent: float = setting(
        'float', onu_dataset.DEFAULT_VALIDATION_PERCENT,
        'Photos in <class>/ folders without a train/val split: the percent held out for val, chosen by a hash of each '
        'file\'s path (the same on every run; adding photos never moves an old one). Training saves it in '
        'run_config.json for eval.', lower_bound=0.0, upper_bound=99.0)
    labels_offset: int | None = setting(
        'integer', None,
        'Records of other tools: subtract this from each stored label (1 for labels that start at 1, label 0 unused '
        'as background); default: from the records\' own evidence.', lower_bound=0)
    seed: int = setting(
        'integer', 0,
        'Seed of what the script draws at random: the photos make_sample_data.py generates, the order '
        'convert_to_tfrecord.py gives training records, training\'s shuffling, augmentation and initial weights (each '
        'worker of a cluster, and each restart, mixes in its task index and start step). The same seed repeats a run.')
