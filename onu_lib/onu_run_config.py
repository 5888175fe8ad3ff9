"""The run configuration: what a training run is, saved as train_dir/run_config.json. onu_eval.py, onu_export.py and
onu_predict.py rebuild the same model from it, and a restarted run checks it can resume. No flags, no TensorFlow.

Format 3 added layout, labels_offset and validation_percent, so that eval, export and predict read the data exactly
as training did; format 2 added format_version and dropped num_classes (len(class_names)). Files of formats 1 and 2
load as photo-folder runs (format 1 as float32); a file from a newer version fails with a line saying to upgrade.
"""
import dataclasses
import json
import os

from onu_lib import onu_dataset
from onu_lib import onu_errors
from onu_lib import onu_files

RUN_CONFIG_FILENAME = 'run_config.json'
FORMAT_VERSION = 3


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A training run: model, input, classes, precision, and the flags it was started with."""
    model: str
    image_size: int
    class_names: tuple = ()
    num_examples_per_epoch: int = 0
    data_dir: str = ''
    data_format: str = 'encoded'
    layout: str = 'photos'  # onu_input.data_layout: photos, class_folders, records, or another tool's layout
    labels_offset: int = None  # other tools' records (or this repo's made from them): class = stored label - it
    validation_percent: float = None  # class_folders: the share of photos held out for val (onu_dataset.split_of)
    cache_decoded_epoch: str = None  # where the decoded epoch is kept: memory, disk or off (--cache_decoded_epoch)
    precision: str = 'float32'
    compute_dtype: str = 'float32'
    max_steps: int = None
    moving_average_decay: float = None  # None or 0: the run kept no moving averages
    flags: dict = dataclasses.field(default_factory=dict, compare=False)
    export: dict = None  # in an exported SavedModel's copy: what was exported, from which checkpoint

    def __post_init__(self):
        object.__setattr__(self, 'class_names', tuple(self.class_names))

    @property
    def num_classes(self):
        """Returns the number of classes the model predicts."""
        return len(self.class_names)

    def split_info(self, split, data_dir=None, data=None):
        """Returns the onu_dataset.DatasetInfo of split read as this run reads its data (format, validation percent,
        labels offset): of data_dir (default: the run's), or of data, its DataDir if described already."""
        data = data or onu_dataset.describe(data_dir or self.data_dir, self.validation_percent, self.labels_offset)
        return data.split(split, self.data_format)

    def replace(self, **changes):
        """Returns a copy with the named fields changed."""
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        """Returns the JSON-ready dictionary of run_config.json (format FORMAT_VERSION)."""
        values = dataclasses.asdict(self)
        values['class_names'] = list(self.class_names)
        if values['export'] is None:
            del values['export']
        return dict(values, format_version=FORMAT_VERSION)

    @classmethod
    def from_dict(cls, values, source='run configuration'):
        """Returns the RunConfig of a run_config.json dictionary of this or the previous format."""
        version = values.get('format_version', 1)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise onu_errors.DataError(
                f'{source}: format_version {version!r} is newer than this onu-classifier reads '
                f'({FORMAT_VERSION}); upgrade it (git pull) to use this run')
        missing = [name for name in ('model', 'image_size') if name not in values]
        if missing:
            raise onu_errors.DataError(
                f'{source}: no {" or ".join(missing)}; it was not written by onu_train.py: '
                f'restore it or train into a new --train_dir')
        if values.get('cache_decoded_epoch') == 'on':  # its spelling before the disk cache
            values = dict(values, cache_decoded_epoch='memory')
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in values.items() if name in names})

    def save(self, directory):
        """Writes the configuration to directory/run_config.json, atomically."""
        os.makedirs(directory, exist_ok=True)
        onu_files.write_text_atomic(path_in(directory),
                                    json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + '\n')

    @classmethod
    def load(cls, directory):
        """Returns the RunConfig saved in directory, or None when there is none."""
        path = path_in(directory)
        if not os.path.exists(path):
            return None
        try:
            with open(path, encoding='utf-8') as f:
                values = json.load(f)
        except (OSError, ValueError) as e:
            raise onu_errors.DataError(
                f'{path}: unreadable run configuration ({e}); restore it or train into a new '
                f'--train_dir') from None
        if not isinstance(values, dict):
            raise onu_errors.DataError(f'{path}: not a run configuration (a JSON object); restore it '
                                        f'or train into a new --train_dir')
        return cls.from_dict(values, source=path)


def path_in(directory):
    """Returns the path of the run configuration in directory."""
    return os.path.join(directory, RUN_CONFIG_FILENAME)
