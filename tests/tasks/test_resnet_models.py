"""Models: the CIFAR ResNets of He et al. 2016 (section 4.2), option-A shortcuts, sizes as documented."""
import pytest
import torch
from torch import nn

from transientvod import config
from transientvod.config import ModelConfig
from transientvod.tasks.resnet import models
from transientvod.tasks.resnet.data import make_synthetic
from transientvod.tasks.resnet.models import BasicBlock, CifarResNet, ZeroPadShortcut, build_model, count_parameters

RESNET32_PARAMETERS = 464_154  # the number models.py's docstring states
DEMO_PARAMETERS = 19_074  # depth 8, width 8, 1 input channel, 10 classes


def resnet_parameters_by_hand(depth: int, width: int, in_channels: int, num_classes: int) -> int:
    """The paper's architecture counted layer by layer: 3x3 convs without bias, BN scale and shift."""
    n = (depth - 2) // 6

    def block(c_in, c_out):
        return 9 * c_in * c_out + 9 * c_out * c_out + 4 * c_out  # two convs, two BNs, no shortcut weights

    stem = 9 * in_channels * width + 2 * width
    stage1 = n * block(width, width)
    stage2 = block(width, 2 * width) + (n - 1) * block(2 * width, 2 * width)
    stage3 = block(2 * width, 4 * width) + (n - 1) * block(4 * width, 4 * width)
    head = 4 * width * num_classes + num_classes
    return stem + stage1 + stage2 + stage3 + head


def test_resnet32_parameter_count_is_the_documented_one():
    count = count_parameters(CifarResNet(depth=32, width=16, in_channels=3, num_classes=10))
    assert count == RESNET32_PARAMETERS
    assert 450_000 <= count <= 470_000  # the paper: 0.46M
    assert count == resnet_parameters_by_hand(32, 16, 3, 10)
    assert f"{RESNET32_PARAMETERS:,}" in models.__doc__


def test_demo_model_parameter_count_is_the_documented_one():
    count = count_parameters(CifarResNet(depth=8, width=8, in_channels=1, num_classes=10))
    assert count == DEMO_PARAMETERS == resnet_parameters_by_hand(8, 8, 1, 10)
    assert f"{DEMO_PARAMETERS:,}" in models.__doc__


@pytest.mark.parametrize("depth, paper_millions", [(20, 0.27), (44, 0.66), (56, 0.85), (110, 1.7)])
def test_other_depths_match_the_paper_table(depth, paper_millions):
    # Table 6 of He et al. 2016 lists these sizes, rounded.
    count = count_parameters(CifarResNet(depth=depth))
    assert count == resnet_parameters_by_hand(depth, 16, 3, 10)
    assert round(count / 1e6, 2 if depth < 100 else 1) == paper_millions


def test_output_shape_for_cifar_images():
    model = CifarResNet(depth=32, width=16, in_channels=3, num_classes=10).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("size", [4, 7, 8, 32])
def test_output_shape_for_small_and_odd_images(size):
    model = CifarResNet(depth=8, width=8, in_channels=1, num_classes=10).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 1, size, size)).shape == (2, 10)


@pytest.mark.parametrize("depth", [33, 2, 0, 9])
def test_depth_must_be_6n_plus_2(depth):
    with pytest.raises(ValueError, match=r"6n\+2"):
        CifarResNet(depth=depth)


def test_width_must_be_positive():
    with pytest.raises(ValueError, match="width is 0"):
        CifarResNet(width=0)


def test_build_model_from_config():
    model = build_model(ModelConfig(name="resnet", depth=8, width=8), in_channels=1, num_classes=10)
    assert isinstance(model, CifarResNet)
    assert count_parameters(model) == DEMO_PARAMETERS


def test_unknown_model_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="model.name is 'vgg'; known models are resnet"):
        build_model(ModelConfig(name="vgg"), in_channels=3, num_classes=10)


def test_config_and_models_know_the_same_names():
    assert set(config.MODELS) == set(models.MODEL_BUILDERS)


def test_option_a_shortcut_has_no_parameters():
    block = BasicBlock(16, 32, stride=2)
    assert isinstance(block.shortcut, ZeroPadShortcut)
    assert list(block.shortcut.parameters()) == [] and list(block.shortcut.buffers()) == []
    two_convs = 9 * 16 * 32 + 9 * 32 * 32
    two_batch_norms = 2 * (32 + 32)
    assert count_parameters(block) == two_convs + two_batch_norms
    # The whole network has 3x3 convolutions only: no 1x1 projection anywhere.
    kernels = {m.kernel_size for m in CifarResNet(depth=32).modules() if isinstance(m, nn.Conv2d)}
    assert kernels == {(3, 3)}


def test_option_a_shortcut_subsamples_and_pads_with_zeros():
    x = torch.randn(2, 16, 8, 8)
    y = ZeroPadShortcut(16, 32, stride=2)(x)
    assert y.shape == (2, 32, 4, 4)
    assert torch.equal(y[:, :16], x[:, :, ::2, ::2])
    assert torch.equal(y[:, 16:], torch.zeros(2, 16, 4, 4))


def test_identity_shortcut_inside_a_stage():
    assert isinstance(BasicBlock(16, 16, stride=1).shortcut, nn.Identity)


def test_initialization():
    model = CifarResNet(depth=32, width=16)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.equal(m.weight, torch.ones_like(m.weight))
            assert torch.equal(m.bias, torch.zeros_like(m.bias))
    # Kaiming normal: standard deviation sqrt(2 / fan_in); 36,864 weights estimate it within ~1%.
    conv = model.stage3[-1].conv2
    fan_in = conv.in_channels * 9
    assert conv.weight.std().item() == pytest.approx((2 / fan_in) ** 0.5, rel=0.05)
    assert abs(conv.weight.mean().item()) < 0.005


def test_gradients_flow_and_training_reduces_the_loss():
    torch.manual_seed(0)
    ds = make_synthetic(256, num_classes=10, image_size=8, channels=1, seed=0)
    model = CifarResNet(depth=8, width=8, in_channels=1, num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(30):
        batch = torch.arange(step * 64, step * 64 + 64) % len(ds.train_y)
        loss = nn.functional.cross_entropy(model(ds.train_x[batch]), ds.train_y[batch])
        optimizer.zero_grad()
        loss.backward()
        if step == 0:  # every parameter, down to the first convolution, gets a gradient
            for name, p in model.named_parameters():
                assert p.grad is not None and p.grad.abs().sum() > 0, name
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0], losses
