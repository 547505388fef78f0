"""What several ``ringkv`` commands share: the model options (``demo``, ``chat``) and the model
they choose, the device configuration (``--config``, ``--numerics``), opening a device over its
link (``chat``, ``storage fsck --link``), and small argparse helpers.

Heavy modules (numpy, the model, the device drivers) are imported inside the functions, so that
``ringkv --help`` starts quickly.
"""

import argparse
import sys

from ringkv.host.errors import UsageError

__all__ = ["NUMERICS_CHOICES", "global_options", "model_args", "positive", "non_negative",
           "no_rest", "backend", "check_weights", "load_model", "model_name", "base_config",
           "device_config", "numerics_name", "trained_or_none", "wait_device", "open_device"]


def global_options(parser, *, default):
    """``--debug``, ``-v``/``--verbose``, ``-q``/``--quiet``: before the command, or after it
    (``default=SUPPRESS`` there, so the one before is not overwritten)."""
    parser.add_argument("--debug", action="store_true", default=default,
                        help="show the traceback of an error")
    parser.add_argument("-v", "--verbose", action="count", default=default,
                        help="more messages (debug)")
    parser.add_argument("-q", "--quiet", action="count", default=default,
                        help="only warnings and errors")


def model_args(p, sampling=False):
    """The model options of ``demo`` and ``chat`` (``sampling``: chat's sampling options)."""
    p.add_argument("--backend", choices=["float64", "fixed"], default=None,
                   help="attention in the FPGA's place: float64 rings or the bit-exact "
                        "fixed-point core model (default: fixed with --image, whose card "
                        "format holds the fixed-point K/V; else float64)")
    p.add_argument("--weights", help=".npz weights (default: the trained weights shipped "
                                          "for the configuration's shape)")
    p.add_argument("--random", action="store_true",
                   help="the untrained model with random weights of --seed instead")
    if sampling:
        p.add_argument("--random-seed", dest="weights_seed", type=non_negative, default=0,
                       help="seed of --random's weights")
        p.add_argument("--temperature", type=float, default=0.0,
                       help="sampling temperature, 0..2 (default 0: greedy)")
        p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling, (0, 1]")
        p.add_argument("--top-k", type=int, default=0, help="the k most likely (0: all)")
        p.add_argument("--seed", type=int, default=None,
                       help="the sampling generator's seed (reproducible answers)")
        p.add_argument("--stop", action="append", default=None,
                       help="stop sequence (repeatable, at most 4)")
    else:
        p.add_argument("--seed", type=non_negative, default=0)
    p.add_argument("--chunk", type=positive, default=64, help="prefill chunk")
    p.add_argument("--capacity", type=positive, default=2,
                   help="records (turn snapshots and checkpoints) the store holds")
    p.add_argument("--image", help="persist the software store to this file")


def _int_at_least(text: str, minimum: int, words: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be {words}, not {value}")
    return value


def positive(text: str) -> int:
    """argparse ``type``: a number of 1 or more."""
    return _int_at_least(text, 1, "a positive number")


def non_negative(text: str) -> int:
    """argparse ``type``: a number of 0 or more (a seed)."""
    return _int_at_least(text, 0, "0 or more")


def no_rest(rest, cmd):
    """Refuse the arguments argparse left over (``rest``) for ``cmd``, which parses all its own."""
    if rest:
        raise UsageError(f"unrecognized arguments: {' '.join(rest)}",
                         hint=f"'ringkv {cmd} --help' lists the options")


def backend(name, config):
    from ringkv.host.model import FixedBackend, Float64Backend
    return FixedBackend(config) if name == "fixed" else Float64Backend(config)


def check_weights(args) -> None:
    """Refuse a ``--weights`` file that cannot be read, before anything is built or started
    (:func:`load_model` reads it later; the simulated demo refuses the option)."""
    if args.weights:
        try:
            with open(args.weights, "rb"):
                pass
        except OSError as e:
            raise UsageError(f"cannot read the weights {args.weights}: {e.strerror or e}",
                             param="weights") from None


def load_model(args, config):
    """``--weights FILE``, else the random model (``--random``, of ``--seed``), else the trained
    weights shipped for ``config``'s shape."""
    import zipfile

    from ringkv.host.errors import ConfigError
    from ringkv.host.model import Model
    if args.weights:
        try:
            return Model.load(args.weights, config)
        except OSError as e:
            raise UsageError(f"cannot read the weights {args.weights}: {e.strerror or e}",
                             param="weights") from None
        except (ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise ConfigError(f"the weights {args.weights} do not fit the model "
                              f"(layers={config.layers} Hq={config.q_heads} "
                              f"Hkv={config.kv_heads} d={config.head_dim}): {e}",
                              param="weights") from None
    if args.random:
        small = config.head_dim * config.q_heads < 256
        return Model(config, hidden=64 if small else 256, ffn=128 if small else 512,
                     seed=getattr(args, "weights_seed", args.seed))
    try:
        return Model.trained(config)
    except FileNotFoundError as e:
        raise UsageError(str(e), param="weights") from None


def model_name(model) -> str:
    if not model.meta:
        return "random weights"
    m = model.meta
    return f"trained on {m['corpus'].split('==')[0]}, step {m['step']} of {m['steps']}"


#: ``--numerics`` choices; the default (None) is ringkv-fx1c with the weights' calibrated scales
#: when the weights carry them (the shipped trained ones do), else ringkv-fx1
NUMERICS_CHOICES = ["ringkv-fx1c", "ringkv-fx1", "ringkv-fx2"]


def base_config(name):
    from ringkv.defs.config import DEFAULT_CONFIG, DEMO_CONFIG
    return {"default": DEFAULT_CONFIG, "demo": DEMO_CONFIG}[name]


def device_config(base, numerics, model=None):
    """The device configuration: ``base``'s shape in ``numerics``; ``ringkv-fx1c`` takes its
    per-layer scales from ``model``'s weights (``None``: fx1c when they carry them, else fx1)."""
    import dataclasses

    from ringkv.host.model.calibrate import calibrated_config
    fracs = getattr(model, "qkv_fracs", None)
    if numerics is None:
        numerics = "ringkv-fx1c" if fracs else "ringkv-fx1"
    if numerics == "ringkv-fx1c":
        if not fracs:
            raise UsageError("ringkv-fx1c needs weights with calibrated q/k/v scales (the "
                             "shipped trained ones, or python -m ringkv.host.model.calibrate FILE "
                             "--write)", param="numerics",
                             hint="use --numerics ringkv-fx1 with these weights")
        return calibrated_config(base, fracs)
    return dataclasses.replace(base, numerics=numerics, qkv_fracs=())


def numerics_name(config) -> str:
    if not config.qkv_fracs:
        return config.numerics
    return (f"{config.numerics} (Fq,Fk,Fv) per layer "
            + " ".join("(" + ",".join(map(str, t)) + ")" for t in config.qkv_fracs))


def trained_or_none(config):
    """The shipped trained model of ``config``'s shape, or ``None`` when there is none."""
    from ringkv.host.model import Model, weights_path
    return Model.trained(config) if weights_path(config).exists() else None


def wait_device(device, where):
    """Wait for the device's own recovery scan (power-on), showing its progress."""
    from ringkv.host.errors import DeviceNotReady

    def progress(st):
        print(f"\rdevice at {where}: recovering its directory, {st['scanned']}/"
              f"{st['regions']} regions", end="", file=sys.stderr, flush=True)
    try:
        st = device.wait_ready(progress=progress)
    except TimeoutError:
        raise DeviceNotReady(f"device at {where} did not finish its recovery scan") from None
    finally:
        print("", end="\r", file=sys.stderr, flush=True)
    return st


def open_device(link_url, config, timeout):
    """An :class:`~ringkv.host.device.fpga.FpgaDevice` at ``link_url`` whose configuration was
    checked and whose recovery scan has ended; ``(device, recovery status)``."""
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    device = FpgaDevice(Link(link_url, timeout=timeout), config)
    try:
        device.check_config()        # refuses a device built for another configuration
        return device, wait_device(device, link_url)
    except BaseException:
        device.link.close()
        raise

