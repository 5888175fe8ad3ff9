"""TensorFlow's tf.data service for training: the address a trainer is given, whether the service answers, which of
its workers are alive, and the dispatcher and worker servers run_data_service.py starts.

A trainer with --data_service=grpc://HOST:PORT sends its input pipeline to the service's dispatcher; the dispatcher's
workers (CPU machines) read, decode, resize (and augment) and send finished batches back (onu_input.service_batches).
The dispatcher and the workers only need TensorFlow: the pipeline travels as a graph.

Neither has authentication or encryption, and both listen on every interface of their machine (TensorFlow's servers
take a port, not an address): run them only on a trusted network or behind a firewall.

A library module: explicit arguments only, no flags.
"""
import re
import threading
import time

from absl import logging
import grpc
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
import tensorflow as tf

from onu_lib import onu_errors
from onu_lib import onu_launch

DEFAULT_PORT = 5050
ADDRESS_FORM = 'grpc://HOST:PORT'
REACH_TIMEOUT_SECS = 10        # how long a trainer tries to reach the dispatcher at start
WORKER_TIMEOUT_MS = 15000      # the dispatcher gives a worker that stops heartbeating this long up
WORKER_HEARTBEAT_MS = 2000     # how often a worker tells the dispatcher it is alive
WATCH_EVERY_SECS = 2.0         # how often a trainer checks that the workers it was given still answer
_GET_WORKERS = '/tensorflow.data.DispatcherService/GetWorkers'  # TensorFlow's dispatcher.proto


class ServiceError(Exception):
    """The tf.data service given to a trainer cannot be used; the message says which address and what to do."""


def service_address(value):
    """Returns --data_service's value as grpc://HOST:PORT (grpc:// may be left out); ServiceError if it is not one."""
    match = re.fullmatch(r'(?:grpc://)?(\[[0-9a-fA-F:.]+\]|[^:/\s]+):(\d{1,5})', value.strip())
    if not match or not 0 < int(match.group(2)) < 65536:
        raise ServiceError(f'--data_service={value} is not an address of a tf.data service\'s dispatcher: '
                           f'give {ADDRESS_FORM}, e.g. --data_service=grpc://localhost:{DEFAULT_PORT}')
    return f'grpc://{match.group(1)}:{match.group(2)}'


def _host_port(address):
    """Returns HOST:PORT of a grpc://HOST:PORT address."""
    return address[len('grpc://'):]


def _get_workers_response_class():
    """Returns the message class of the dispatcher's GetWorkersResponse (the pip package has no Python module of it)."""
    proto = descriptor_pb2.FileDescriptorProto(name='onu_get_workers.proto', package='onu_data_service',
                                               syntax='proto3')
    worker_info = proto.message_type.add(name='WorkerInfo')
    worker_info.field.add(name='address', number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    response = proto.message_type.add(name='GetWorkersResponse')
    response.field.add(name='workers', number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                       label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                       type_name='.onu_data_service.WorkerInfo')
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName('onu_data_service.GetWorkersResponse'))


_GetWorkersResponse = _get_workers_response_class()


def registered_workers(address, timeout_secs, wait_for_ready=True):
    """Returns the HOST:PORT of every worker the dispatcher at address has registered (dead ones too: it keeps
    them); grpc.RpcError when it does not answer within timeout_secs (at once if refused, without wait_for_ready)."""
    with grpc.insecure_channel(_host_port(address)) as channel:
        get_workers = channel.unary_unary(_GET_WORKERS, request_serializer=lambda request: request,
                                          response_deserializer=_GetWorkersResponse.FromString)
        response = get_workers(b'', timeout=timeout_secs, wait_for_ready=wait_for_ready)
    return [worker.address for worker in response.workers]


def check_reachable(address, timeout_secs=REACH_TIMEOUT_SECS):
    """Returns the dispatcher's registered workers; ServiceError naming the address when it does not answer."""
    try:
        return registered_workers(address, timeout_secs, wait_for_ready=False)
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            reason = f'no answer within {timeout_secs:g} s'
        elif error.code() == grpc.StatusCode.UNIMPLEMENTED:
            reason = 'what answers there is not a tf.data dispatcher'
        else:  # gRPC's details end with the cause: '...: Connection refused', '...: Domain name not found]'
            reason = (error.details() or error.code().name).rsplit(': ', 1)[-1].strip('[]')
        raise ServiceError(
            f'cannot reach the tf.data service at {address} ({reason}): start its dispatcher there '
            f'({onu_errors.shell_command("run_data_service.py", port=_host_port(address).rsplit(":", 1)[1])}) '
            f'or fix --data_service'
        ) from None


class WorkerWatchHook(tf.compat.v1.train.SessionRunHook):
    """Warns once for each of the service's workers that stops answering while training runs, from a thread that
    looks every WATCH_EVERY_SECS (the dispatcher lists a dead worker for good, so each one is asked directly)."""

    def __init__(self, address, every_secs=WATCH_EVERY_SECS):
        self._address = address
        self._every_secs = every_secs
        self._stop = threading.Event()
        self._thread = None
        self.lost = []

    def begin(self):
        self._thread = threading.Thread(target=self._watch, name='data-service-watch', daemon=True)
        self._thread.start()

    def end(self, session):
        self._stop.set()

    def _watch(self):
        seen = set()
        while not self._stop.wait(self._every_secs):
            try:
                workers = registered_workers(self._address, self._every_secs)
            except grpc.RpcError:
                continue  # a dispatcher that restarts: the trainer's own client waits for it
            seen.update(workers)
            for worker in sorted(seen - set(self.lost)):
                if not onu_launch.answers(worker):
                    self.lost.append(worker)
                    alive = len(seen) - len(self.lost)
                    logging.warning('tf.data service worker %s stopped answering; training goes on with the other '
                                    '%d worker(s) of %s%s', worker, alive, self._address,
                                    '' if alive else ' (none left: training waits until one registers)')


def start_dispatcher(port, work_dir):
    """Starts a fault-tolerant dispatcher on port (0: a free one) that journals its state in work_dir, so that
    restarted there it resumes its jobs; returns it."""
    return tf.data.experimental.service.DispatchServer(tf.data.experimental.service.DispatcherConfig(
        port=port, work_dir=work_dir, fault_tolerant_mode=True, worker_timeout_ms=WORKER_TIMEOUT_MS))


def start_worker(dispatcher, host, port=0):
    """Starts a worker for the dispatcher at HOST:PORT that the trainers reach at host:port (0: a free port)."""
    return tf.data.experimental.service.WorkerServer(tf.data.experimental.service.WorkerConfig(
        dispatcher_address=dispatcher, worker_address=f'{host}:%port%', port=port,
        heartbeat_interval_ms=WORKER_HEARTBEAT_MS))


def wait_for_workers(address, count, timeout_secs):
    """Returns once the dispatcher at address has registered count workers; TimeoutError after timeout_secs."""
    deadline = time.monotonic() + timeout_secs
    while True:
        try:
            if len(registered_workers(address, 1.0)) >= count:
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f'the tf.data service at {address} has not registered {count} worker(s) '
                               f'in {timeout_secs:g} s')
        time.sleep(0.2)
