"""Tests of onu_precision: the precision chosen for the hardware, the CPU's flags, the session options."""

import pytest
import tensorflow as tf

from onu_lib import onu_precision


def test_choose_precision_follows_the_hardware():
    epyc = onu_precision.Hardware('AMD EPYC', ())
    zen4 = onu_precision.Hardware('AMD EPYC', ('avx512_bf16',))
    xeon = onu_precision.Hardware('Intel Xeon', ('amx_bf16', 'avx512_bf16'))
    v100 = onu_precision.Hardware('AMD EPYC', (), (('Tesla V100', (7, 0)),))
    p100 = onu_precision.Hardware('Intel Xeon', ('avx512_bf16',), (('Tesla P100', (6, 0)),))
    choose = onu_precision.choose_precision
    assert choose('auto', xeon) == (onu_precision.Precision('mixed', 'cpu'), None)
    assert choose('auto', zen4)[0].compute_dtype == 'bfloat16'
    assert choose('auto', v100) == (onu_precision.Precision('mixed', 'gpu'), None)
    assert choose('auto', v100)[0].compute_dtype == 'float16'
    for hardware in (epyc, p100):  # no fast path where the model runs: auto is float32, silently
        assert choose('auto', hardware) == (onu_precision.Precision('float32'), None)
        precision, warning = choose('mixed', hardware)
        assert precision.compute_dtype == 'float32'
        assert warning.startswith('--precision=mixed: ') and warning.endswith('training in float32 instead')
        assert '\n' not in warning
    assert 'AMD EPYC' in choose('mixed', epyc)[1] and 'Tesla P100' in choose('mixed', p100)[1]
    assert choose('float32', xeon) == (onu_precision.Precision('float32'), None)
    with pytest.raises(ValueError, match='half'):
        choose('half', xeon)


def test_cpu_flags_come_from_proc_cpuinfo(tmp_path):
    cpuinfo = tmp_path / 'cpuinfo'
    cpuinfo.write_text('processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse avx512f avx512_bf16\n\n'
                       'processor\t: 1\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse avx512f avx512_bf16\n')
    model, cpu_flags = onu_precision.read_cpu_info(str(cpuinfo))
    assert model == 'Test CPU 9000' and {'avx512_bf16', 'avx512f'} <= cpu_flags and 'amx_bf16' not in cpu_flags
    assert onu_precision.read_cpu_info(str(tmp_path / 'missing')) == ('', set())
    model, cpu_flags = onu_precision.read_cpu_info()  # this machine
    hardware = onu_precision.detect_hardware()
    assert hardware.cpu_bfloat16_flags == tuple(f for f in onu_precision.CPU_BFLOAT16_FLAGS if f in cpu_flags)


def test_precision_options_turn_on_the_matching_rewrite():
    rewriter = tf.compat.v1.ConfigProto().graph_options.rewrite_options
    for dtype, on in (('bfloat16', 'auto_mixed_precision_onednn_bfloat16'), ('float16', 'auto_mixed_precision'),
                      ('float32', None)):
        config = onu_precision.set_precision_options(tf.compat.v1.ConfigProto(), dtype)
        switches = {name: getattr(config.graph_options.rewrite_options, name) for name in
                    ('auto_mixed_precision', 'auto_mixed_precision_onednn_bfloat16')}
        assert {name for name, value in switches.items() if value == rewriter.ON} == ({on} if on else set())
        assert config.graph_options.optimizer_options.global_jit_level == 0
    config = onu_precision.set_precision_options(tf.compat.v1.ConfigProto(), 'float32', xla=True)
    assert config.graph_options.optimizer_options.global_jit_level == tf.compat.v1.OptimizerOptions.ON_1
