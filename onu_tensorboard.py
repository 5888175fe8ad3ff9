"""Starts TensorBoard without its start-up noise: TensorFlow's native start-up lines, and the fast-loading note.

    python onu_tensorboard.py --logdir /tmp/onu_train          # then open http://localhost:6006
    python onu_tensorboard.py --logdir_spec=mine:/tmp/runs,study:/tmp/onu_benchmark/hparams   # runs side by side

Every other argument is TensorBoard's own (`tensorboard --help`); --verbose shows all that it and TensorFlow print.
TensorBoard's fast loader (--load_fast, a separate data server) prints a note at each start: this runs the classic
loader unless --load_fast is given.
"""
import logging
import sys

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402  (TensorFlow's start-up lines dropped: TensorBoard loads it too)
from tensorboard import main as tensorboard_main  # noqa: E402


def tensorboard_arguments(argv):
    """argv for TensorBoard: without --verbose, and with the classic loader unless argv chooses one."""
    argv = [arg for arg in argv if not onu_cli.verbose_requested([arg])]
    if any(arg.startswith('--load_fast') for arg in argv):
        return argv
    return argv + ['--load_fast=false']


if __name__ == '__main__':
    if not onu_cli.verbose_requested():
        # Its warning for each resumed run ("more than one graph event per run"): every start writes the graph
        # again, and TensorBoard shows the newest, which is all it warns about.
        logging.getLogger('tensorboard').setLevel(logging.ERROR)
    sys.argv = tensorboard_arguments(sys.argv)
    tensorboard_main.run_main()
