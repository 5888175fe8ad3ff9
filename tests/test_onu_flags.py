"""Tests of onu_lib/onu_flags.py: the training flags read once into one onu_training.TrainingOptions."""

import dataclasses

from absl import flags

import onu_input
from onu_lib import onu_flags
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
