"""The hardware a run computes on and the precision it computes in.

detect_hardware finds the CPU's bfloat16 instructions and the GPUs TensorFlow sees; choose_precision turns a requested
precision (auto, float32 or mixed) into a Precision for that hardware; resolve_precision does both for this machine
and prints the outcome; session_config and set_precision_options make the session config a run computes with. The
float16 optimizer wrapping is onu_model.make_optimizer's. Variables, moving averages and checkpoints stay float32.

A library module: explicit arguments only, no flags.
"""
import dataclasses
import sys

import tensorflow as tf

PRECISIONS = ('float32', 'mixed')  # with 'auto' (the hardware decides) the --precision choices
CPU_BFLOAT16_FLAGS = ('amx_bf16', 'avx512_bf16')  # /proc/cpuinfo flags of a fast bfloat16 path
MIN_FLOAT16_COMPUTE_CAPABILITY = (7, 0)  # tensor cores: V100 and later


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What decides the precision: the CPU's bfloat16 flags and the GPUs' compute capabilities."""
    cpu_model: str
    cpu_bfloat16_flags: tuple           # those of CPU_BFLOAT16_FLAGS that /proc/cpuinfo lists
    gpus: tuple = ()                    # ((name, (major, minor)), ...) as TensorFlow sees them


def read_cpu_info(path='/proc/cpuinfo'):
    """Returns (CPU model name, set of CPU flags) from /proc/cpuinfo ('', empty set where absent)."""
    model, cpu_flags = '', set()
    try:
        with open(path, encoding='utf-8') as f:
            for line in f:
                key, _, value = line.partition(':')
                if key.strip() == 'model name' and not model:
                    model = value.strip()
                elif key.strip() == 'flags' and not cpu_flags:
                    cpu_flags = set(value.split())
    except OSError:
        pass
    return model, cpu_flags


def visible_gpus():
    """The GPUs TensorFlow sees: the one answer to "is there a GPU" (none on this project's machines)."""
    return tf.config.list_physical_devices('GPU')


def detect_hardware():
    """Returns this machine's Hardware: CPU flags from /proc/cpuinfo, GPUs from TensorFlow."""
    model, cpu_flags = read_cpu_info()
    gpus = []
    for gpu in visible_gpus():
        details = tf.config.experimental.get_device_details(gpu)
        gpus.append((details.get('device_name', gpu.name), tuple(details.get('compute_capability', (0, 0)))))
    return Hardware(model, tuple(flag for flag in CPU_BFLOAT16_FLAGS if flag in cpu_flags), tuple(gpus))


@dataclasses.dataclass(frozen=True)
class Precision:
    """The precision a run computes in: name 'float32' or 'mixed', and where mixed computes."""
    name: str
    device: str = 'cpu'   # 'gpu': float16 with loss scaling; 'cpu': bfloat16 through oneDNN

    @property
    def compute_dtype(self):
        """Returns the dtype of the rewritten ops: float32, bfloat16 (CPU) or float16 (GPU)."""
        if self.name == 'float32':
            return 'float32'
        return 'float16' if self.device == 'gpu' else 'bfloat16'

    def describe(self):
        """Returns a one-line description, e.g. 'mixed (bfloat16 compute on the CPU, float32 variables)'."""
        if self.name == 'float32':
            return 'float32'
        where = 'the GPU, dynamic loss scaling' if self.device == 'gpu' else 'the CPU through oneDNN'
        return f'mixed ({self.compute_dtype} compute on {where}; float32 variables)'


def choose_precision(requested, hardware):
    """Returns (Precision, warning or None) for requested ('auto', 'float32' or 'mixed') on hardware: auto is mixed
    where the hardware has a fast path, else float32; mixed without one warns and runs float32."""
    if requested not in PRECISIONS + ('auto',):
        raise ValueError(f'precision={requested!r}; expected auto, {", ".join(PRECISIONS)}')
    if requested == 'float32':
        return Precision('float32'), None
    if hardware.gpus:  # the model runs on the GPU: only its float16 path counts
        if any(capability >= MIN_FLOAT16_COMPUTE_CAPABILITY for _, capability in hardware.gpus):
            return Precision('mixed', 'gpu'), None
        missing = (f'the GPU ({hardware.gpus[0][0]}, compute capability '
                   f'{".".join(map(str, hardware.gpus[0][1]))}) has no fast float16 (needs 7.0+)')
    elif hardware.cpu_bfloat16_flags:
        return Precision('mixed', 'cpu'), None
    else:
        missing = (f'the CPU ({hardware.cpu_model or "unknown"}) lists neither '
                   f'{" nor ".join(CPU_BFLOAT16_FLAGS)}, and no GPU is visible')
    if requested == 'auto':
        return Precision('float32'), None
    return Precision('float32'), f'--precision=mixed: {missing}; training in float32 instead'


def resolve_precision(requested, use_gpus=True):
    """Returns the Precision that --precision gives here; prints the devices, it and any warning. use_gpus False:
    the model runs on the CPU even where GPUs are visible (onu_eval --device=cpu)."""
    hardware = detect_hardware()
    if not use_gpus:
        hardware = dataclasses.replace(hardware, gpus=())
    precision, warning = choose_precision(requested, hardware)
    if warning:
        print(f'warning: {warning}', file=sys.stderr, flush=True)
    gpus = ', '.join(f'{name} (compute capability {".".join(map(str, capability))})'
                     for name, capability in hardware.gpus) or 'none visible' + ('' if use_gpus else ' (--device=cpu)')
    bfloat16 = ', '.join(hardware.cpu_bfloat16_flags) or 'no bfloat16 instructions'
    print(f'GPUs: {gpus}; CPU: {hardware.cpu_model or "unknown"} ({bfloat16}); precision: '
          f'{precision.describe()}', flush=True)
    return precision


def session_config(hide_gpus=False):
    """Returns the session config: soft placement so one graph runs on CPU or GPU, GPU memory on demand."""
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    if hide_gpus:
        config.device_count['GPU'] = 0
    config.gpu_options.allow_growth = True
    return config


def set_precision_options(config, compute_dtype, xla=False):
    """Returns config (a ConfigProto) with the rewrite to compute_dtype (float16: Grappler's, on a GPU; bfloat16:
    oneDNN's, on the CPU; variables stay float32) turned on, and XLA if asked."""
    rewrite = config.graph_options.rewrite_options
    if compute_dtype == 'float16':
        rewrite.auto_mixed_precision = rewrite.ON
    elif compute_dtype == 'bfloat16':
        rewrite.auto_mixed_precision_onednn_bfloat16 = rewrite.ON
    if xla:
        config.graph_options.optimizer_options.global_jit_level = tf.compat.v1.OptimizerOptions.ON_1
    return config
