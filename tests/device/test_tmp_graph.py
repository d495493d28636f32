import numpy as np, pytest, vmem
from tests.device.test_cuda_standin import _vgg, _resnet, BOUND

@pytest.mark.parametrize("precision,math", [("fp32","exact"),("fp32","tf32"),("bf16","tf32"),("fp16","tf32")])
@pytest.mark.parametrize("policy", ["baseline", "auto"])
def test_graph(cupy, precision, math, policy):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    out = []
    for name, opts in (("cpu", {}), ("cuda:0", {"math": math, "conv_api": "graph"})):
        net = _vgg().init(seed=0)
        with vmem.device(name, memory="4MiB", **opts) as dev, vmem.Trainer(net, device=dev, policy=policy, seed=0, precision=precision) as tr:
            for _ in range(3):
                tr.step(x, y)
            tr.sync()
            algos = tr.plan(len(x)).plan.algos
        out.append(net.params)
    print(algos)
    print(cupy._cudnn.graph_runs[-6:])
    worst = max(float(np.abs(out[0][k] - out[1][k]).max()) for k in out[0])
    print(precision, math, policy, worst)
