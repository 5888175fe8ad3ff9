"""Tests of onu_errors.py: every command a message gives the user pastes whole from a path with a space."""
import functools
import os

import pytest

from conftest import PRINTED_FLAG, copy_train_dir, pasted, printed_command
from onu_lib import onu_checkpoint
from onu_lib import onu_data_service
from onu_lib import onu_dataset
from onu_lib import onu_errors
from onu_lib import onu_hparams
from onu_lib import onu_serving
import onu_predict

def error_of(call):
    """The message of the one-line error that call() raises for the user."""
    with pytest.raises((onu_errors.UserError, onu_data_service.ServiceError)) as error:
        call()
    return str(error.value)


def test_shell_command_quotes_each_value_and_leaves_placeholders_to_replace():
    assert onu_errors.shell_command('onu_train.py', train_dir='/tmp/run') == 'python onu_train.py --train_dir=/tmp/run'
    assert pasted(onu_errors.shell_command('x.py', a="/my runs/tom's", b='$HOME;rm -rf')) == [
        'x.py', "--a=/my runs/tom's", '--b=$HOME;rm -rf']
    assert onu_errors.shell_flag('data_dir', '<your photo folder>') == '--data_dir=<your photo folder>'


def test_every_printed_command_pastes_as_its_arguments_from_a_path_with_a_space(tiny_run, tmp_path):
    base = tmp_path / 'my runs' / "tom's"
    empty = str(base / 'empty')
    os.makedirs(empty)
    train_dir = copy_train_dir(tiny_run, base, 'run 1', exports=False)
    newest = os.path.join(train_dir, 'model.ckpt-12')
    with open(newest + '.data-00000-of-00001', 'r+b') as f:
        f.truncate(10)
    alternative = os.path.join(train_dir, 'model.ckpt-10')
    export_dir = os.path.join(train_dir, 'export')
    missing_data = str(base / 'no data')
    no_photos = str(base / 'no photos')
    os.makedirs(no_photos)
    commands = {  # what a message printed -> the arguments it must paste as
        error_of(lambda: onu_checkpoint.find_checkpoint(empty)): ['onu_train.py', f'--train_dir={empty}'],
        error_of(lambda: onu_checkpoint.find_checkpoint(
            train_dir, use_instead=functools.partial(onu_predict.export_instead, train_dir))):
            ['onu_export.py', f'--checkpoint_dir={train_dir}', f'--checkpoint_path={alternative}'],
        onu_serving.retry_command(newest, export_dir):
            ['onu_export.py', f'--checkpoint_path={newest}', f'--export_dir={export_dir}'],
        error_of(lambda: onu_dataset.describe(missing_data)):
            ['make_sample_data.py', f'--data_dir={missing_data}'],
        error_of(lambda: onu_dataset.find_class_names(no_photos)):
            ['make_sample_data.py', f'--data_dir={no_photos}'],
        onu_dataset.convert_command(train_dir, 'raw'):
            ['convert_to_tfrecord.py', f'--data_dir={train_dir}', '--format=raw'],
        error_of(lambda: onu_data_service.check_reachable('grpc://127.0.0.1:9', timeout_secs=2)):
            ['run_data_service.py', '--port=9'],
    }
    for message, arguments in commands.items():
        assert pasted(printed_command(message)) == arguments, message
    flags = {  # a flag a message tells the user to pass -> the argument it must paste as
        error_of(lambda: onu_checkpoint.find_checkpoint(train_dir)): f'--checkpoint_path={alternative}',
        error_of(lambda: onu_checkpoint.find_checkpoint(
            train_dir, use_instead=functools.partial(onu_predict.export_instead, train_dir))):
            f'--model_dir={export_dir}',
        onu_hparams.row_caution(train_dir, empty): f'--eval_dir={os.path.join(train_dir, "eval")}',
    }
    for message, argument in flags.items():
        assert argument.split('=')[0] in message
        printed = [word for word in PRINTED_FLAG.findall(message) if word.startswith(argument.split('=')[0] + '=')]
        assert [pasted(f'python {word}') for word in printed] == [[argument]], message
    assert onu_hparams.row_caution(train_dir, os.path.join(train_dir, 'eval')) is None
