"""A function shipped to a rank keeps the file its code came from (cloudpickle >= 3.1.3 ships every
code object as if from "<dynamic-code>"; tracebacks, hang verdicts and cell labels need the file)."""
import pickle

from notebook_launch.wire import pickling, shared_tensors


def test_a_shipped_function_keeps_its_code_file():
    namespace: dict = {"__name__": "__main__"}
    exec(compile("def train(x):\n    def inner():\n        return x\n    return inner\n",
                 "/tmp/ipykernel_1/1234.py", "exec"), namespace)
    data = shared_tensors.dumps(namespace["train"], None)
    train = pickle.loads(data)
    assert train.__code__.co_filename == "/tmp/ipykernel_1/1234.py"
    inner = train(1).__code__   # nested code objects too
    assert inner.co_filename == "/tmp/ipykernel_1/1234.py"


def test_reduce_code_leaves_everything_else_alone():
    assert pickling.reduce_code(42) is NotImplemented
    assert pickling.reduce_code("<dynamic-code>") is NotImplemented
