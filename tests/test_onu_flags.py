"""Tests of onu_lib/onu_flags.py: the training flags read once into one onu_training.TrainingOptions."""

import dataclasses

from absl import flags
import pytest

import onu_input
from onu_lib import onu_dataset
from onu_lib import onu_flags
from onu_lib import onu_precision
from onu_lib import onu_training

FLAGS = flags.FLAGS
onu_flags.define_training_flags()


def test_every_training_option_is_read_from_its_flag(parsed):
    options = parsed('--train_dir=/tmp/t', '--data_dir=/tmp/d', '--batch_size=7', '--max_steps=9',
                     '--augmentations=hue,rotation', '--cache_decoded_epoch=off', '--profile_steps=3,5',
                     '--checkpoint_exclude_scopes=A/Logits,B', '--save_checkpoint_secs=0', '--labels_offset=1')
    assert isinstance(options, onu_training.TrainingOptions)
    assert (options.train_dir, options.data_dir, options.batch_size, options.max_steps) == ('/tmp/t', '/tmp/d', 7, 9)
    assert options.augmentations == onu_input.AugmentOptions({'hue', 'rotation'})
    assert options.cache_decoded_epoch == 'off' and options.profile_steps == (3, 5)
    assert options.checkpoint_exclude_scopes == ('A/Logits', 'B') and options.save_checkpoint_secs == 0
    assert options.labels_offset == 1
    assert options.flag_values['batch_size'] == 7 and options.flag_values['train_dir'] == '/tmp/t'
    # Every field but the recorded flag values is a flag of the same name (one name for one thing).
    fields = {field.name for field in dataclasses.fields(onu_training.TrainingOptions)} - {'flag_values'}
    assert fields <= set(FLAGS), fields - set(FLAGS)


def test_defaults_leave_the_model_and_data_to_decide(parsed):
    options = parsed()
    assert options.model is None and options.image_size is None and options.learning_rate is None
    assert options.cache_decoded_epoch == 'auto' and options.cache_dir is None and options.profile_steps is None
    assert options.augmentations == onu_input.AugmentOptions.default() == onu_input.AugmentOptions.of(True)
    # README "Changed defaults": every script's data in /tmp/onu_data (where make_sample_data.py writes), seed 0.
    assert (options.data_dir, options.seed) == ('/tmp/onu_data', 0)


@pytest.mark.parametrize('model_flag, model, image_size', [(None, 'small', 64), ('inception_resnet_v2', None, 299),
                                                           ('small', None, 64)])
def test_the_model_and_its_image_size_default_to_the_models_own(parsed, tiny_data_dir, model_flag, model, image_size):
    """README: --model is small without a GPU; --image_size defaults to the model's own (299 or 64)."""
    options = parsed(f'--data_dir={tiny_data_dir}', *([f'--model={model_flag}'] if model_flag else []))
    data = onu_dataset.describe(tiny_data_dir)
    run_config = onu_training.training_run_config(options, onu_precision.Precision('float32'), data,
                                                  data.split('train', 'encoded'))
    assert (run_config.model, run_config.image_size) == (model or model_flag, image_size)
    assert run_config.flags['image_size'] is None  # chosen, not given
