"""What an onu_benchmark.py run concludes: rows of medians (assemble_*), pass/fail targets with their issue numbers,
the Markdown tables (markdown_report) and the files (write_outputs: <timestamp>.json, .md, .png, HParams sessions)."""
import json
import math
import os
import statistics

import numpy as np

from benchmark import measure as benchmark_measure
from benchmark import plan as benchmark_plan
from benchmark import runner as benchmark_runner
from onu_lib import onu_hparams
from onu_lib import onu_pool
from onu_lib import onu_precision

ROW_ORDER = benchmark_plan.PIPELINE_WAYS + ('decode_limit', 'synthetic')
ROW_TITLES = {
    'encoded': 'encoded JPEG in TFRecords (gfile)',
    'raw': 'raw pixels in TFRecords (tobytes)',
    'images': 'original images, tf.data pipeline (the fix)',
    'serial_cv2': 'original images, serial cv2 loop + feed_dict (the study)',
    'keras_layers': 'original images, Keras image_dataset_from_directory + Keras augmentation layers',
    'keras_reader': 'original images, Keras image_dataset_from_directory + onu_input augmentation',
    'decode_limit': 'decode limit: cores x one-core decode+resize',
    'synthetic': 'synthetic in-memory batch (no input)',
    'encoded_decoding': 'encoded, onu_input without the decoded-epoch cache (decodes every image)',
    'encoded_on_model': 'encoded, augmentation placed on the model (--augment_on=model)',
    'plain_tf_image': 'original images, plain tf.image pipeline (full decode, per-image tf.image ops)',
    'study_serial': 'original images, the study\'s serial loop as written (augments the full photo)',
    'inception': 'encoded JPEG in the Inception/ImageNet converter\'s shards, read as they are (side by side with '
                 'encoded)',
}
STEP_KIND_TITLES = {
    'forward_conv': 'forward convolutions (Conv2D)',
    'input_gradient_conv': 'input-gradient convolutions (Conv2DBackpropInput)',
    'weight_gradient_conv': 'weight-gradient convolutions (Conv2DBackpropFilter)',
    'batch_norm': 'batch norm (+ grad)',
    'other': 'everything else (pooling, ReLU, casts, loss, optimizer, ...)',
}
# A kind of op below this share of the float32 step's op time is too small to hold the step's gain back.
MIN_STEP_KIND_SHARE = 0.1


def _median(results, field):
    """Returns the median of field over a list of result dicts."""
    return statistics.median(result[field] for result in results)


def _rates(measured, stage):
    """Returns a pipeline row's {stage_images_per_sec, stage_cores_busy}: the medians of its repeats."""
    return {f'{stage}_images_per_sec': _median(measured, 'images_per_sec'),
            f'{stage}_cores_busy': _median(measured, 'cores_busy')}


def assemble_rows(results, settings):
    """Returns {row name: {measure: median}} for every way and baseline (see ROW_ORDER)."""
    models = settings.models
    read = results[('read_files',)]
    source_bytes = read[0]['bytes']
    rows = {'images': {'disk_bytes': source_bytes, 'disk_ratio': 1.0, 'read_seconds': _median(read, 'seconds')},
            'serial_cv2': {'disk_bytes': source_bytes, 'disk_ratio': 1.0},
            'keras_layers': {'disk_bytes': source_bytes, 'disk_ratio': 1.0},
            'keras_reader': {'disk_bytes': source_bytes, 'disk_ratio': 1.0},
            'decode_limit': {}, 'synthetic': {}}
    rows.update({way: {} for way in benchmark_plan.SMALL_MODEL_TRAINING_WAYS})
    cores = onu_pool.worker_count()
    for way in benchmark_plan.RECORD_WAYS:
        converted = results[('convert', way, cores)]
        rows[way] = {'disk_bytes': converted[-1]['record_bytes'],
                     'disk_ratio': converted[-1]['record_bytes'] / converted[-1]['source_bytes'],
                     'conversion_seconds': _median(converted, 'seconds'),
                     'pixel_bytes': converted[-1]['pixel_bytes']}
    rows['raw']['conversion_seconds_1_process'] = _median(results[('convert', 'raw', 1)], 'seconds')
    for way in benchmark_plan.PIPELINE_WAYS:
        for stage in ('eval', 'train'):
            if ('pipeline', way, stage) in results:
                rows[way].update(_rates(results[('pipeline', way, stage)], stage))
    for way in benchmark_plan.TF_DATA_WAYS:  # training: onu_input's default pipeline at its steady state
        rows[way].update(_rates(results[('augment', way, settings.image_size, 'cached')], 'train'))
    limit = results[('decode_limit',)]
    rows['decode_limit'] = {'eval_images_per_sec': _median(limit, 'images_per_sec'), 'cores': limit[0]['cores'],
                            'single_core_images_per_sec': _median(limit, 'single_core_images_per_sec'),
                            'single_core_cores_busy': _median(limit, 'single_core_cores_busy'),
                            'cv2_single_core_images_per_sec': _median(limit, 'cv2_single_core_images_per_sec')}
    for model_name in models:
        synthetic = results[('training', model_name, 'synthetic')][0]
        small_ways = benchmark_plan.SMALL_MODEL_TRAINING_WAYS if model_name == 'small' else ()
        for way in benchmark_plan.TRAINING_WAYS + small_ways:
            rows[way].setdefault('training', {})[model_name] = _training_entry(
                results[('training', model_name, way)][0], synthetic, way)
    layout = results.get(('layout', benchmark_plan.LAYOUT_MODEL))
    if layout:
        written = results[('write_inception',)][-1]
        rows['inception'] = {'disk_bytes': written['bytes'], 'disk_ratio': written['bytes'] / source_bytes,
                             'side_by_side': {way: layout[0][way]['examples_per_sec'] for way in benchmark_plan.LAYOUT_WAYS}}
        synthetic = results[('training', benchmark_plan.LAYOUT_MODEL, 'synthetic')][0]
        rows['inception']['training'] = {benchmark_plan.LAYOUT_MODEL: _training_entry(
            layout[0]['inception'], synthetic, 'inception')}
    names = ROW_ORDER + benchmark_plan.SMALL_MODEL_TRAINING_WAYS + (('inception',) if layout else ())
    return {name: rows[name] for name in names}


def _training_entry(measured, synthetic, way):
    """Returns a training row's entry: sec/batch, examples/sec, the input wait training would log, and the
    input-bound fraction (1 - the synthetic batch's sec/batch / this way's)."""
    entry = {key: measured[key] for key in ('sec_per_batch', 'examples_per_sec', 'batch_size', 'image_size')
             if key in measured}
    if way not in benchmark_plan.FEED_DICT_WAYS:
        entry.update({key: measured[key] for key in ('wait_fraction', 'work_ms_per_batch') if key in measured})
    if way != 'synthetic':
        entry['input_bound_fraction'] = max(0.0, 1.0 - synthetic['sec_per_batch'] / measured['sec_per_batch'])
    return entry


def assemble_wait_tracing(results):
    """Returns the main job's examples/sec with and without a step traced for its input wait, or None."""
    measured = results.get(('wait_tracing', benchmark_plan.LAYOUT_MODEL))
    if not measured:
        return None
    speeds = {name: measured[0][name]['examples_per_sec'] for name in ('untraced', 'traced')}
    return dict(speeds, trace_every=benchmark_plan.WAIT_TRACE_EVERY, ratio=speeds['traced'] / speeds['untraced'],
                model=benchmark_plan.LAYOUT_MODEL)


def assemble_records_rows(results, settings, formats, infos):
    """Returns {format or synthetic: {disk_bytes, eval/train images_per_sec, cores busy, training: {model: ...}}}."""
    rows = {fmt: {'disk_bytes': sum(os.path.getsize(path) for path in infos[fmt].files)} for fmt in formats}
    rows['synthetic'] = {}
    for fmt in formats:
        for stage in ('eval', 'train'):
            rows[fmt].update(_rates(results[('pipeline', fmt, stage)], stage))
    for model_name in settings.models:
        synthetic = results[('training', model_name, 'synthetic')][0]
        for way in formats + ('synthetic',):
            rows[way].setdefault('training', {})[model_name] = _training_entry(
                results[('training', model_name, way)][0], synthetic, way)
    return rows


def assemble_counting(results, settings):
    """Returns the seconds to find and count the synthetic set of other tools' shards, cold and cached."""
    return dict({state: _median(results[('count_records', state)], 'seconds') for state in ('cold', 'cached')},
                shards=settings.count_shards, records=settings.count_records)


def assemble_precision(results, settings):
    """Returns {model: {'way variant': training result}} for float32, mixed and XLA rows of PRECISION_WAYS."""
    table = {}
    for model_name in settings.models:
        entries = table[model_name] = {}
        for way in benchmark_plan.PRECISION_WAYS:
            measured_variants = results[('precision', model_name, way)][0]
            for variant in benchmark_measure.TRAINING_VARIANTS:
                measured = measured_variants[variant]
                entries[f'{way} {variant}'] = {name: measured[name] for name in (
                    'sec_per_batch', 'examples_per_sec', 'final_loss', 'batch_size', 'image_size',
                    'sec_per_batch_repeats')}
    return table


def assemble_augmentation(results):
    """Returns {'way size variant': {images_per_sec, cores_busy, cpu_ms_per_image}} of training preprocessing."""
    table = {}
    for key, measured in results.items():
        if key[0] == 'augment':
            rates = {field: _median(measured, field) for field in ('images_per_sec', 'cores_busy')}
            table[' '.join(str(part) for part in key[1:])] = dict(
                rates, cpu_ms_per_image=benchmark_measure.cpu_ms_per_image(rates))
    return table


def _single_result(results, key):
    """Returns the one result of the task with key, without the runner's own fields, or None if it did not run."""
    measured = results.get(key)
    if not measured:
        return None
    return {name: value for name, value in measured[0].items()
            if name not in ('other_processes_cores', 'task_seconds')}


def assemble_step_profile(results):
    """Returns the step profile of benchmark_plan.PROFILED_MODEL (measure_step_profile's), or None if not measured."""
    return _single_result(results, ('step_profile', benchmark_plan.PROFILED_MODEL))


def assemble_data_service(results):
    """Returns measure_data_service's result (the service's part of the run), or None if not measured."""
    return _single_result(results, ('data_service', benchmark_plan.DATA_SERVICE_MODEL))


def _target(issue, text, measured, threshold, at_most=False):
    """Returns one target's verdict: measured >= threshold (or <= with at_most)."""
    passed = measured <= threshold if at_most else measured >= threshold
    return {'issue': issue, 'target': text, 'measured': measured, 'threshold': threshold,
            'comparison': '<=' if at_most else '>=', 'passed': bool(passed)}


def evaluate_targets(rows, augmentation, precision, settings, cores):
    """Returns the verdicts on the speed and size targets of issues 2, 3, 7, 12, 13, 20 and 21."""
    models = settings.models
    raw, encoded, images = rows['raw'], rows['encoded'], rows['images']
    targets = [
        _target(2, 'encoded records / source photo bytes', encoded['disk_ratio'], 1.002, at_most=True),
        _target(2, 'raw records / sum(H*W*3)', raw['disk_bytes'] / raw['pixel_bytes'], 1.01, at_most=True),
        _target(2, 'encoded conversion speed / reading the photos once (cold cache)',
                images['read_seconds'] / encoded['conversion_seconds'], 0.5),
        _target(2, f'raw conversion speed on {cores} cores / on 1 process',
                raw['conversion_seconds_1_process'] / raw['conversion_seconds'], 1.6),
        _target(3, 'encoded eval preprocessing / decode limit',
                encoded['eval_images_per_sec'] / rows['decode_limit']['eval_images_per_sec'], 0.8),
        _target(3, 'images eval / encoded eval', images['eval_images_per_sec'] / encoded['eval_images_per_sec'], 0.9),
        _target(3, 'raw eval / encoded eval', raw['eval_images_per_sec'] / encoded['eval_images_per_sec'], 1.0),
    ]
    for way in benchmark_plan.TF_DATA_WAYS:
        train_rate = rows[way]['train_images_per_sec']
        targets.append(_target(3, f'{way} training augmentation / serial cv2 loop, same augmentation',
                               train_rate / rows['serial_cv2']['train_images_per_sec'], 2.5))
        targets.append(_target(3, f'{way} training augmentation / Keras image_dataset_from_directory + the same '
                                  'augmentations as Keras layers',
                               train_rate / rows['keras_layers']['train_images_per_sec'], 1.2))
    for size in benchmark_plan.augmentation_sizes(settings.image_size):
        for way in benchmark_plan.TF_DATA_WAYS:
            cached, plain = augmentation[f'{way} {size} cached'], augmentation[f'{way} {size} plain_tf_image']
            targets.append(_target(12, f'{way} training preprocessing at {size}: CPU ms/img, onu_input / plain '
                                       'tf.image pipeline (the previous onu_input algorithm)',
                                   cached['cpu_ms_per_image'] / plain['cpu_ms_per_image'], 0.5, at_most=True))
            targets.append(_target(12, f'{way} training preprocessing at {size}: img/s, onu_input / plain tf.image '
                                       'pipeline', cached['images_per_sec'] / plain['images_per_sec'], 1.2))
    study = augmentation[f'study_serial {settings.image_size} serial']
    targets.append(_target(12, f'images training preprocessing at {settings.image_size}: img/s, onu_input / the '
                               'study\'s serial loop as written',
                           augmentation[f'images {settings.image_size} cached']['images_per_sec']
                           / study['images_per_sec'], 2.5))
    if 'small' in models:
        targets.append(_target(12, 'main job (small model, encoded) input-bound fraction',
                               rows['encoded']['training']['small']['input_bound_fraction'], 0.25, at_most=True))
    fast_path = bool(onu_precision.detect_hardware().cpu_bfloat16_flags)
    for model_name, threshold in (('small', 1.8), ('inception_resnet_v2', 1.25)):
        if model_name in models and fast_path:
            entries = precision[model_name]
            targets.append(_target(13, f'{model_name}, model only (synthetic batch): mixed / float32 examples/sec',
                                   entries['synthetic mixed']['examples_per_sec']
                                   / entries['synthetic float32']['examples_per_sec'], threshold))
    if 'small' in models:
        main_job = (precision['small']['encoded mixed'] if fast_path else
                    rows['encoded']['training']['small'])['examples_per_sec']
        targets.append(_target(
            13, f'main job ({"mixed" if fast_path else "float32"}, encoded) / plain-TF float32 version '
                '(plain tf.image pipeline + small CNN) examples/sec',
            main_job / rows['plain_tf_image']['training']['small']['examples_per_sec'], 2.0 if fast_path else 1.5))
    ranked = [rows[way].get('training', {}).get('small', {}) for way in benchmark_plan.WAIT_RANKED_WAYS]
    if all('work_ms_per_batch' in entry for entry in ranked):
        order = sorted(range(len(ranked)), key=lambda i: ranked[i]['input_bound_fraction'])
        logged = sorted(range(len(ranked)), key=lambda i: ranked[i]['work_ms_per_batch'])
        targets.append(_target(21, 'main job fed by tf.data (encoded cached, encoded decoding, plain tf.image): the '
                                   'logged input work ranks the rows as the input-bound fraction does (1 = same order)',
                               float(order == logged), 1.0))
    if 'inception' in rows:
        speeds = rows['inception']['side_by_side']
        targets.append(_target(20, f'{benchmark_plan.LAYOUT_MODEL} model trained from Inception/ImageNet shards / '
                                   'from encoded records of the same photos, examples/sec (side by side)',
                               speeds['inception'] / speeds['encoded'], 0.95))
    if 'inception_resnet_v2' in models:
        speeds = [rows[way]['training']['inception_resnet_v2']['examples_per_sec']
                  for way in benchmark_plan.TF_DATA_WAYS]
        targets.append(_target(7, 'Inception-ResNet-v2: fastest / slowest of images, raw, encoded',
                               max(speeds) / min(speeds), 1.10, at_most=True))
        for way in benchmark_plan.TF_DATA_WAYS:
            targets.append(_target(7, f'Inception-ResNet-v2 input-bound fraction, {way}',
                                   rows[way]['training']['inception_resnet_v2']['input_bound_fraction'], 0.10,
                                   at_most=True))
    return targets


def _megabytes(num_bytes):
    """Returns bytes as '123.4 MB' (or GB above 10 GB)."""
    return f'{num_bytes / 1e9:.2f} GB' if num_bytes >= 1e10 else f'{num_bytes / 1e6:.1f} MB'


def _cell(value, digits=1):
    """Returns a number formatted for a table, or a dash if absent."""
    return '-' if value is None else f'{value:.{digits}f}'


def _table(header, rows):
    """Returns a Markdown table."""
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join(' --- ' for _ in header) + '|']
    return '\n'.join(lines + ['| ' + ' | '.join(str(cell) for cell in row) + ' |' for row in rows])


def _rate_cell(row, stage):
    """Returns 'images/sec (cores busy)' of a pipeline row's stage, or a dash if not measured."""
    if f'{stage}_images_per_sec' not in row:
        return '-'
    return f'{row[f"{stage}_images_per_sec"]:.1f} ({row[f"{stage}_cores_busy"]:.1f})'


def _run_description(report):
    """Returns the lines that say what ran where: command, hardware, machine load, data and settings."""
    settings, hardware, others = report['settings'], report['hardware'], report['other_processes']
    gpus = ', '.join(hardware['gpus']) or 'no GPU'
    return [f'Command: `{report["command"]}`', '',
            f'Hardware: {hardware["cpu_model"]}, {hardware["usable_cores"]} cores ({hardware["cpu_count"]} CPUs), '
            f'{hardware["memory_gib"]} GiB, {gpus}; TensorFlow {hardware["tensorflow"]}, Python {hardware["python"]}. '
            f'1-minute load average {report["load_average_before"]:.2f} before the run; the run took '
            f'{benchmark_runner.format_duration(report["seconds"])}. Other processes kept '
            f'{others["mean_cores"]:.2f} cores busy on '
            f'average during the measurements (at most {others["max_cores"]:.2f} during one; '
            f'{others["disturbed_measurements"]} of {others["measurements"]} measurements above '
            f'{benchmark_runner.BUSY_MACHINE_CORES}).', '',
            f'Data: {settings["data_dir"]}: {report["data"]["photos"]} photos ({report["data"]["train_photos"]} '
            f'train), {_megabytes(report["data"]["source_bytes"])}. Medians of {settings["repeats"]} repeat(s); '
            f'pipelines {settings["image_size"]}x{settings["image_size"]}, batch {settings["batch_size"]}, '
            f'{settings["batches"]} timed batches after {settings["warmup_batches"]}.', '']


def study_comparison_table(report, model_name):
    """Returns the Markdown table shaped like the study's: model_name's training speed fed by each way."""
    rows = report['rows']
    ways = (('encoded', 'raw', 'images', 'serial_cv2', 'synthetic')
            + (benchmark_plan.SMALL_MODEL_TRAINING_WAYS if model_name == 'small' else ())
            + (('inception',) if model_name in rows.get('inception', {}).get('training', {}) else ()))
    return _table(['way', 'sec/batch', 'examples/sec', 'input-bound', 'logged: waiting, input work', 'data on disk'], [
        [ROW_TITLES[way]] + _training_cells(rows[way]['training'][model_name], way)
        + [_megabytes(rows[way]['disk_bytes']) if 'disk_bytes' in rows[way] else '-']
        for way in ways])


def _training_cells(entry, way):
    """Returns a training row's cells: sec/batch, examples/sec, input-bound fraction and what training would log."""
    return [_cell(entry['sec_per_batch'], 3), _cell(entry['examples_per_sec']),
            f'{entry.get("input_bound_fraction", 0):.0%}' if way != 'synthetic' else '-', _logged_cell(entry)]


def _percent(fraction):
    """Returns a fraction as '12%', or a dash if absent."""
    return '-' if fraction is None else f'{fraction:.0%}'


def _logged_cell(entry):
    """Returns what training would log of a row's input: 'waiting, input work per batch' (dashes if absent)."""
    work = entry.get('work_ms_per_batch')
    return f'{_percent(entry.get("wait_fraction"))}, {"-" if work is None else f"{work:.0f} ms"}'


def wait_tracing_sentence(report):
    """Returns the sentence on what measuring the input wait for every log line costs the main job."""
    tracing = report['wait_tracing']
    return (f'Measuring what input costs as training logs it (one step in {tracing["trace_every"]} run with a '
            f'software trace) costs the main job ({tracing["model"]}, encoded) {1 - tracing["ratio"]:.1%} of its '
            f'speed: {tracing["traced"]:.1f} examples/sec with it, {tracing["untraced"]:.1f} without (windows '
            f'alternated). "Logged" is that measurement on each row over {benchmark_measure.WAIT_TRACED_STEPS} traced '
            f'steps: "waiting", the median share of a step spent in the input iterator\'s get_next; "input work", '
            f'the input pipeline\'s own account of its work per batch (tf.data\'s: its workers\' busy time, waits '
            f'for a core included). "Input-bound" compares the row\'s step with the synthetic batch\'s. On this CPU '
            f'no row waits: the pipelines keep ahead of the model. What slows a step is that the input\'s work takes '
            f'the cores the model would use: input-bound counts that, and "input work" shows it, ranking the rows '
            f'the same way. On a GPU, where the model does not need the cores, a starved step waits instead. The '
            f'serial loops feed each batch before the step (feed_dict), outside any tf.data pipeline: not measured '
            f'this way (a dash).')


def storage_table(report):
    """Returns the Markdown table of bytes on disk and seconds to make them, per way of storing."""
    rows = report['rows']
    return _table(['way', 'data on disk', 'x source', 'seconds to make', ''], [
        [ROW_TITLES['images'], _megabytes(rows['images']['disk_bytes']), '1.000',
         _cell(rows['images']['read_seconds'], 2), 'reading the photos once, cold cache'],
        [ROW_TITLES['encoded'], _megabytes(rows['encoded']['disk_bytes']),
         _cell(rows['encoded']['disk_ratio'], 3), _cell(rows['encoded']['conversion_seconds'], 2),
         'onu_converter.convert, cold cache'],
        [ROW_TITLES['raw'], _megabytes(rows['raw']['disk_bytes']), _cell(rows['raw']['disk_ratio'], 3),
         _cell(rows['raw']['conversion_seconds'], 2),
         f'{rows["decode_limit"]["cores"]} processes; 1 process: '
         f'{rows["raw"]["conversion_seconds_1_process"]:.2f} s']]
        + ([[ROW_TITLES['inception'], _megabytes(rows['inception']['disk_bytes']),
             _cell(rows['inception']['disk_ratio'], 3), '-', 'written by benchmark.measure.write_inception_shards']]
           if 'inception' in rows else []))


def counting_sentence(report):
    """Returns the sentence on how long finding and counting the synthetic set of other tools' shards took."""
    counting = report['record_counting']
    return (f'Finding and counting {counting["shards"]:,} TF-slim shards of {counting["records"]:,} records '
            f'(onu_layouts, as training does): {counting["cold"]:.2f} s from a cold start (empty count cache, cold '
            f'page cache), {counting["cached"]:.3f} s with the counts cached.')


def pipeline_table(report):
    """Returns the Markdown table of input pipeline images/sec, eval and training, and the decode limit."""
    rows = report['rows']
    return _table(['way', 'eval preprocessing', 'training augmentation'], [
        [ROW_TITLES[way]] + [_rate_cell(rows[way], stage) for stage in ('eval', 'train')]
        for way in benchmark_plan.PIPELINE_WAYS]
        + [[ROW_TITLES['decode_limit'], f'{rows["decode_limit"]["eval_images_per_sec"]:.1f}', '-']])


def _decode_rates_sentence(report):
    """Returns the sentence on one core's decode+resize rate with TensorFlow and with cv2."""
    limit = report['rows']['decode_limit']
    return (f'One core decodes+resizes {limit["single_core_images_per_sec"]:.1f} img/s with '
            f'TensorFlow (the pipelines\' decoder; {limit["single_core_cores_busy"]:.2f} cores busy '
            f'while measured) and {limit["cv2_single_core_images_per_sec"]:.1f} img/s with cv2.')


DATA_SERVICE_TITLES = {'local': 'here (no service)', 'service': 'service worker, augmenting there',
                       'service_on_model': 'service worker, augmentation on the model'}


def data_service_table(part, rate_field):
    """Returns the Markdown table of one part of the service's measurement (training or the pipeline alone)."""
    return _table(['pipeline', 'examples/sec', 'trainer CPU ms/img', 'worker CPU ms/img', 'bytes/example sent'], [
        [DATA_SERVICE_TITLES[placement], _cell(result[rate_field]), _cell(result['trainer_cpu_ms_per_image'], 2),
         _cell(result['worker_cpu_ms_per_image'], 2) if placement != 'local' else '-',
         f'{result["bytes_per_example"] / 1000:.1f} kB' if placement != 'local' else '-']
        for placement, result in part.items()])


def data_service_paragraph(report):
    """Returns the paragraph that turns the pipeline's measured CPU ms per image into the cores one GPU needs."""
    pipeline, size, rate = report['data_service']['pipeline'], report['settings']['image_size'], \
        benchmark_plan.GPU_IMAGES_PER_SEC

    def cores(ms_per_image):
        return f'{rate * ms_per_image / 1000:.1f}'
    local, service, on_model = pipeline['local'], pipeline['service'], pipeline['service_on_model']
    return (f'Cores to feed one H100-class GPU training Inception-ResNet-v2 at {size}x{size} (about {rate} img/s in '
            f'mixed precision, estimated from published tables, not measured: no GPU here), from the CPU ms per '
            f'image measured above with the decoded-epoch cache off: with the pipeline on the GPU machine, '
            f'{cores(local["trainer_cpu_ms_per_image"])} of its cores per GPU; with it on tf.data service workers '
            f'augmenting there, {cores(service["worker_cpu_ms_per_image"])} worker cores and '
            f'{cores(service["trainer_cpu_ms_per_image"])} on the GPU machine; with the augmentation on the model '
            f'(the GPU), {cores(on_model["worker_cpu_ms_per_image"])} worker cores and '
            f'{cores(on_model["trainer_cpu_ms_per_image"])} on the GPU machine. The service worker ran on the '
            f'trainer\'s cores here, so its examples/sec say little; its CPU per image is the figure to carry over.')


def data_service_section(report):
    """Returns the Markdown lines of the service's part of a run."""
    part, settings = report['data_service'], report['settings']
    first = part['training']['local']
    size = settings['image_size']
    return ['### tf.data service: the pipeline here or on one local service worker (encoded records, no decoded-epoch '
            'cache)', '', f'Training {part["model"]}, batch {first["batch_size"]}, {first["image_size"]}x'
            f'{first["image_size"]}, {part["repeats"]} window(s) of {part["steps"]} steps after {part["warmup_steps"]}:',
            '', data_service_table(part['training'], 'examples_per_sec'), '',
            f'The pipeline alone, batch {settings["batch_size"]}, {size}x{size}, {part["batches"]} batches after '
            f'{part["warmup_batches"]}:', '',
            data_service_table(part['pipeline'], 'images_per_sec'), '', data_service_paragraph(report), '']


def targets_table(report):
    """Returns the Markdown table of the targets' verdicts."""
    return _table(['issue', 'target', 'measured', 'verdict'], [
        [target['issue'], f'{target["target"]} {target["comparison"]} {target["threshold"]:g}',
         f'{target["measured"]:.3f}', 'PASS' if target['passed'] else 'FAIL']
        for target in report['targets']])


def records_markdown(report):
    """Returns a run on a folder of records as Markdown: the feeding modes it has, pipelines and training."""
    rows, settings, hardware = report['rows'], report['settings'], report['hardware']
    formats = [name for name in rows if name != 'synthetic']
    lines = [f'Command: `{report["command"]}`', '',
             f'Hardware: {hardware["cpu_model"]}, {hardware["usable_cores"]} cores, {hardware["memory_gib"]} GiB, '
             f'{", ".join(hardware["gpus"]) or "no GPU"}; TensorFlow {hardware["tensorflow"]}. The run took '
             f'{benchmark_runner.format_duration(report["seconds"])}; other processes kept '
             f'{report["other_processes"]["mean_cores"]:.2f} cores busy on average.', '',
             f'Data: {settings["data_dir"]}: {report["layout"]} records, {report["data"]["records"]} train examples '
             f'of {len(report["data"]["class_names"])} classes; formats {", ".join(formats)}.', '',
             f'### Input pipelines: images/sec at {settings["image_size"]}x{settings["image_size"]}, batch '
             f'{settings["batch_size"]} (cores busy in brackets)', '',
             _table(['format', 'data on disk', 'eval preprocessing', 'training augmentation'],
                    [[fmt, _megabytes(rows[fmt]['disk_bytes'])] + [_rate_cell(rows[fmt], stage) for stage in
                                                                    ('eval', 'train')] for fmt in formats]), '']
    for model_name in settings['models']:
        first = rows['synthetic']['training'][model_name]
        lines += [f'### Feeding modes compared: {model_name}, batch {first["batch_size"]}, '
                  f'{first["image_size"]}x{first["image_size"]}', '',
                  _table(['fed by', 'sec/batch', 'examples/sec', 'input-bound', 'logged: waiting, input work'],
                         [[way] + _training_cells(rows[way]['training'][model_name], way)
                          for way in formats + ['synthetic']]), '']
    return '\n'.join(lines + [counting_sentence(report)]) + '\n'


def markdown_report(report):
    """Returns the run as Markdown: settings, the study-shaped table per model, details and targets."""
    if report.get('kind') == 'records':
        return records_markdown(report)
    if report.get('kind') == 'data_service':
        return '\n'.join(_run_description(report) + data_service_section(report))
    rows, settings = report['rows'], report['settings']
    lines = _run_description(report)
    for model_name in settings['models']:
        first = rows['synthetic']['training'][model_name]
        lines += [f'### Feeding modes compared: {model_name}, batch {first["batch_size"]}, '
                  f'{first["image_size"]}x{first["image_size"]}, training augmentation, '
                  f'{settings["train_steps"][model_name]} timed step(s) x {settings["repeats"]} repeat(s)', '',
                  study_comparison_table(report, model_name), '']
        if model_name == (report.get('wait_tracing') or {}).get('model'):
            lines += [wait_tracing_sentence(report), '']
    lines += ['### Storage and conversion', '', storage_table(report), '', counting_sentence(report), '',
              f'### Input pipelines: images/sec at {settings["image_size"]}x{settings["image_size"]}, '
              f'batch {settings["batch_size"]} (cores busy in brackets)', '',
              pipeline_table(report), '', _decode_rates_sentence(report), '',
              '### Precision and XLA: examples/sec (loss after the timed steps in brackets)', '',
              precision_table(report), '']
    profile = report.get('step_profile')
    if profile:
        lines += [f'### Where the {profile["model"]} model\'s step time goes, float32 vs mixed (model only): '
                  f'ms per step, batch {profile["batch_size"]}, {profile["image_size"]}x{profile["image_size"]}',
                  '', step_profile_table(profile), '', step_profile_summary(profile), '']
    if report.get('data_service'):
        lines += data_service_section(report)
    lines += ['### Training preprocessing: CPU ms per image (images/sec in brackets)', '',
              augmentation_table(report), '',
              '### Targets', '', targets_table(report)]
    return '\n'.join(lines) + '\n'


def _speedup(float32_ms, mixed_ms):
    """Returns float32 time / mixed time as '2.10x', or a dash where mixed took no time."""
    return f'{float32_ms / mixed_ms:.2f}x' if mixed_ms > 0 else '-'


def step_profile_table(profile):
    """Returns the Markdown table of a step's op time by kind of op, float32 and mixed, and the whole step."""
    float32, mixed = profile['float32'], profile['mixed']
    table_rows = [[STEP_KIND_TITLES[kind], _cell(float32['kinds_ms'][kind], 2), _cell(mixed['kinds_ms'][kind], 2),
                   _speedup(float32['kinds_ms'][kind], mixed['kinds_ms'][kind])]
                  for kind in benchmark_measure.STEP_KINDS]
    table_rows.append(['all ops (sum of op times over threads, traced steps)', _cell(float32['ops_ms'], 2),
                       _cell(mixed['ops_ms'], 2), _speedup(float32['ops_ms'], mixed['ops_ms'])])
    table_rows.append(['whole step (wall clock, untraced steps)', _cell(float32['step_ms'], 2),
                       _cell(mixed['step_ms'], 2), _speedup(float32['step_ms'], mixed['step_ms'])])
    return _table(['kind of op', 'float32 ms', 'mixed ms', 'float32 / mixed'], table_rows)


def _kind_name(kind):
    """Returns a kind of op as words for a sentence: 'weight-gradient convolutions'."""
    return STEP_KIND_TITLES[kind].split(' (')[0]


def _step_gains_sentence(profile):
    """Returns the sentences on the whole step's gain from the rewrite and on each kind of op's."""
    float32, mixed = profile['float32'], profile['mixed']
    gains = ', '.join(f'{_kind_name(kind)} {_speedup(float32["kinds_ms"][kind], mixed["kinds_ms"][kind])}'
                      for kind in benchmark_measure.STEP_KINDS)
    return (f'With the {profile["compute_dtypes"]["mixed"]} rewrite the whole step takes {mixed["step_ms"]:.1f} ms '
            f'instead of {float32["step_ms"]:.1f} ms ({_speedup(float32["step_ms"], mixed["step_ms"])}), the sum of '
            f'its op times {_speedup(float32["ops_ms"], mixed["ops_ms"])}. By kind: {gains}.')


def _least_gain_sentence(profile):
    """Returns the sentences on the kind of op (of at least MIN_STEP_KIND_SHARE of the float32 op time) that gains
    least, and what the op time would gain had it gained as much as the best; '' if fewer than two such kinds."""
    float32, mixed = profile['float32']['kinds_ms'], profile['mixed']['kinds_ms']
    total32, total_mixed = profile['float32']['ops_ms'], profile['mixed']['ops_ms']
    gains = {kind: float32[kind] / mixed[kind] for kind in benchmark_measure.STEP_KINDS
             if mixed[kind] > 0 and float32[kind] >= MIN_STEP_KIND_SHARE * total32}
    if len(gains) < 2:
        return ''
    least, best = min(gains, key=gains.get), max(gains, key=gains.get)
    as_best = total_mixed - mixed[least] + float32[least] / gains[best]
    return (f'Among the kinds of op with at least {MIN_STEP_KIND_SHARE:.0%} of the float32 op time, '
            f'{_kind_name(least)} gained least: {gains[least]:.2f}x, on {mixed[least] / total_mixed:.0%} of the '
            f'mixed op time ({float32[least] / total32:.0%} in float32). Had {_kind_name(least)} gained as much as '
            f'{_kind_name(best)} ({gains[best]:.2f}x), the op time would have gained {total32 / as_best:.2f}x '
            f'instead of {total32 / total_mixed:.2f}x.')


def step_profile_summary(profile):
    """Returns what the step profile table shows, in sentences made from its numbers."""
    return ' '.join(part for part in (_step_gains_sentence(profile), _least_gain_sentence(profile)) if part)


def precision_table(report):
    """Returns the Markdown table of float32, mixed and XLA training, model only and end to end."""
    table_rows = []
    for model_name, entries in report['precision'].items():
        for way in benchmark_plan.PRECISION_WAYS:
            base = entries[f'{way} float32']
            cells = [f'{entries[f"{way} {variant}"]["examples_per_sec"]:.1f} '
                     f'({entries[f"{way} {variant}"]["final_loss"]:.3f})'
                     for variant in benchmark_measure.TRAINING_VARIANTS]
            speedups = [f'{entries[f"{way} {variant}"]["examples_per_sec"] / base["examples_per_sec"]:.2f}x'
                        for variant in benchmark_measure.PRECISION_VARIANTS]
            table_rows.append([f'{model_name}, batch {base["batch_size"]}, {base["image_size"]}px',
                               'model only (synthetic batch)' if way == 'synthetic' else 'end to end (encoded)']
                              + cells + speedups)
    return _table(['model', 'fed by', 'float32', 'mixed', 'XLA', 'mixed / float32', 'XLA / float32'], table_rows)


def augmentation_table(report):
    """Returns the Markdown table of training preprocessing: a row per mode and variant, a column per size."""
    augmentation = report['augmentation']
    sizes = benchmark_plan.augmentation_sizes(report['settings']['image_size'])
    titles = {'cached': 'onu_input (default: decoded epoch cached in memory, steady state)',
              'disk': 'onu_input, decoded epoch cached on local disk (--cache_decoded_epoch=disk, steady state)',
              'decoding': 'onu_input, no cache (reads and decodes every image)',
              'reduced_decode': 'onu_input, no cache, JPEGs decoded at a reduced DCT scale (--reduced_decode)',
              'on_model': 'onu_input, augmentation on the model (--augment_on=model, here the CPU)',
              'plain_tf_image': 'plain tf.image pipeline (the previous onu_input algorithm)',
              'serial': ''}
    table_rows = []
    for key in dict.fromkeys(' '.join(name.split()[::2]) for name in augmentation):
        way, variant = key.split()
        title = {'study_serial': 'the study\'s serial loop as written (augments the full photo)',
                 'serial_cv2': 'SerialCv2Loader (resizes first, onu_input augmentation)'}.get(way, way)
        cells = []
        for size in sizes:
            result = augmentation.get(f'{way} {size} {variant}')
            cells.append('-' if result is None else
                         f'{result["cpu_ms_per_image"]:.2f} ({result["images_per_sec"]:.0f})')
        table_rows.append([f'{title}, {titles[variant]}'.rstrip(', ')] + cells)
    return _table(['way'] + [f'{size}x{size}' for size in sizes], table_rows)


def _pyplot():
    """Returns matplotlib.pyplot drawing off screen (imported here: only a report's PNG needs it)."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    return plt


def _save_figure(plt, figure, title, path):
    """Titles figure, writes it as a PNG at path and frees it."""
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_records_report(report, path):
    """Draws a run on a folder of records (training speed per format and model) as a PNG at path."""
    plt = _pyplot()
    rows, models = report['rows'], report['settings']['models']
    figure, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5), squeeze=False)
    for axis, model_name in zip(axes[0], models):
        ways = list(rows)
        axis.bar(ways, [rows[way]['training'][model_name]['examples_per_sec'] for way in ways],
                 color=['tab:green'] * (len(ways) - 1) + ['tab:gray'])
        axis.set_title(f'training {model_name} (examples/sec)')
    _save_figure(plt, figure, f'{report["settings"]["data_dir"]} ({report["layout"]}): '
                 f'{report["hardware"]["cpu_model"]}, {report["hardware"]["usable_cores"]} cores', path)


def plot_data_service_report(report, path):
    """Draws the service's part of a run (CPU ms per image here and on the worker, per placement) as a PNG at path."""
    plt = _pyplot()
    part = report['data_service']
    figure, axes = plt.subplots(1, 2, figsize=(14, 5), squeeze=False)
    for axis, name in zip(axes[0], ('training', 'pipeline')):
        results = part[name]
        placements = list(results)
        positions = np.arange(len(placements))
        for offset, field, colour, label in ((-0.2, 'trainer_cpu_ms_per_image', 'tab:blue', 'trainer'),
                                             (0.2, 'worker_cpu_ms_per_image', 'tab:orange', 'service worker')):
            axis.bar(positions + offset, [results[p][field] for p in placements], 0.4, color=colour, label=label)
        axis.set_xticks(positions, [DATA_SERVICE_TITLES[p].replace(', ', ',\n') for p in placements])
        axis.set_title(f'{name}: CPU ms per image')
        axis.legend(fontsize='small')
    _save_figure(plt, figure, f'tf.data service: {report["hardware"]["cpu_model"]}, '
                              f'{report["hardware"]["usable_cores"]} cores', path)


def plot_report(report, path):
    """Draws the comparison (disk, pipeline rates, training speed per model) as a PNG at path."""
    if report.get('kind') == 'records':
        plot_records_report(report, path)
        return
    if report.get('kind') == 'data_service':
        plot_data_service_report(report, path)
        return
    plt = _pyplot()
    rows, models = report['rows'], report['settings']['models']
    ways = benchmark_plan.PIPELINE_WAYS
    columns = 2 if models else 1
    rows_of_plots = math.ceil((2 + len(models)) / columns)
    figure, axes = plt.subplots(rows_of_plots, columns, figsize=(7 * columns, 5 * rows_of_plots), squeeze=False)
    axes = axes.ravel()
    for axis in axes[2 + len(models):]:
        axis.set_visible(False)
    short = {'encoded': 'encoded', 'raw': 'raw', 'images': 'images\ntf.data', 'serial_cv2': 'images\nserial cv2',
             'keras_layers': 'images\nKeras\nlayers', 'keras_reader': 'images\nKeras +\nonu_input',
             'synthetic': 'synthetic'}
    axes[0].bar([short[w] for w in ('encoded', 'raw', 'images')],
                [rows[w]['disk_bytes'] / 1e6 for w in ('encoded', 'raw', 'images')], color='tab:gray')
    axes[0].set_title('data on disk (MB)')
    positions = np.arange(len(ways))
    for offset, stage, colour in ((-0.2, 'eval', 'tab:blue'), (0.2, 'train', 'tab:orange')):
        axes[1].bar(positions + offset, [rows[w].get(f'{stage}_images_per_sec', 0) for w in ways], 0.4, color=colour,
                    label='eval preprocessing' if stage == 'eval' else 'training augmentation')
    axes[1].axhline(rows['decode_limit']['eval_images_per_sec'], color='black', linestyle='--',
                    label='decode limit (eval)')
    axes[1].set_xticks(positions, [short[w] for w in ways])
    axes[1].set_title(f'input pipeline (images/sec, {report["settings"]["image_size"]}px)')
    axes[1].legend(fontsize='small')
    for axis, model_name in zip(axes[2:], models):
        training_ways = ('encoded', 'raw', 'images', 'serial_cv2', 'synthetic')
        speeds = [rows[w]['training'][model_name]['examples_per_sec'] for w in training_ways]
        bars = axis.bar([short[w] for w in training_ways], speeds,
                        color=['tab:green'] * 4 + ['tab:gray'])
        for bar, way in zip(bars, training_ways):
            bound = rows[way]['training'][model_name].get('input_bound_fraction')
            if bound is not None:
                axis.annotate(f'{bound:.0%} input-bound', (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                              ha='center', va='bottom', fontsize='small')
        first = rows['synthetic']['training'][model_name]
        axis.set_title(f'training {model_name}, batch {first["batch_size"]}, {first["image_size"]}px (examples/sec)')
    _save_figure(plt, figure, f'{report["hardware"]["cpu_model"]}, {report["hardware"]["usable_cores"]} cores, '
                              f'{", ".join(report["hardware"]["gpus"]) or "no GPU"}', path)


# A training row's figures (benchmark_measure's names) -> the HParams table's training metrics.
HPARAMS_METRICS = {'examples_per_sec': onu_hparams.EXAMPLES_PER_SEC_TAG, 'wait_fraction': onu_hparams.WAIT_FRACTION_TAG,
                   'work_ms_per_batch': onu_hparams.WORK_TAG}


def write_hparams_sessions(report, logdir):
    """Writes each training row of the feeding-mode comparison as an HParams session, logdir/<way>-<model>."""
    for way, row in report.get('rows', {}).items():
        for model_name, entry in row.get('training', {}).items():
            settings = dict(benchmark_plan.TRAINING_WAY_SETTINGS[way], model=model_name,
                            image_size=entry['image_size'], batch_size=entry['batch_size'], replicas=1,
                            precision='float32')
            metrics = {tag: entry[key] for key, tag in HPARAMS_METRICS.items() if key in entry}
            onu_hparams.write_measured_session(os.path.join(logdir, f'{way}-{model_name}'), settings, metrics)


def write_outputs(report, output_dir):
    """Writes <timestamp>.json, .md and .png to output_dir, and the training rows as HParams sessions under
    <timestamp>-hparams/; returns their paths."""
    os.makedirs(output_dir, exist_ok=True)
    stem = os.path.join(output_dir, report['timestamp'])
    paths = {'json': stem + '.json', 'md': stem + '.md', 'png': stem + '.png', 'hparams': stem + '-hparams'}
    with open(paths['json'], 'w', encoding='utf-8') as f:
        json.dump(report, f, indent=1)
        f.write('\n')
    with open(paths['md'], 'w', encoding='utf-8') as f:
        f.write(markdown_report(report))
    plot_report(report, paths['png'])
    write_hparams_sessions(report, paths['hparams'])
    return paths

