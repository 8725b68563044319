"""The node's options are declared once (peercache.config.NodeConfig) and every surface derives from it:
peercache-bench's flags, HiCache's extra-config keys, their checks, and Node's keyword arguments."""
from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

import peercache
from peercache import client, config, hicache, node, tags
from peercache.bench import cli, options
from peercache.config import NodeConfig
from peercache.errors import ConfigError
from peercache.node import Node

#: HiCache's extra-config keys: an interface, changed only on purpose.
EXTRA_KEYS = ["auth_key", "auth_key_file", "bind", "devices", "dir_cache_ttl", "directory", "discovery_addr",
              "gid_index", "host_discovery", "ib_port", "integrity", "max_channels", "metrics_addr", "model",
              "page_bytes", "pool_bytes", "protocol", "tenant", "timeout"]


def _all_options():
    return [*NodeConfig.options().values(), *hicache.StoreConfig.options().values(),
            *config.options(options.BenchOptions).values()]


def test_every_option_has_a_one_line_doc_a_check_and_a_surface():
    for o in _all_options():
        assert o.doc and "\n" not in o.doc, o.name
        assert o.flag or o.key or o.name in ("heartbeat_interval",), f"{o.name} is on no surface"
        assert o.check is not None or o.type == "bool", f"{o.name} has no check"
        assert o.unit in ("", "s", "ms", "B", "µs", "pages", "threads", "entries"), (o.name, o.unit)


#: What Node takes beside a NodeConfig: the node's name and pool size in slots, transport options
#: added to the config's, and the geometry a producer registers (none of them an option, all None by default).
NODE_OWN = {"config", "name", "pool_slots", "transport_options", "geometry"}


@pytest.mark.parametrize("cls, own", [(Node, NODE_OWN)], ids=["Node"])
def test_node_and_client_take_their_defaults_from_nodeconfig_alone(cls, own):
    params = inspect.signature(cls.__init__).parameters
    with_default = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    # a default added back to __init__ (max_channels: int = 4, ...) is a second list of defaults
    assert set(with_default) <= own and all(v is None for v in with_default.values()), with_default
    fields = {f.name for f in dataclasses.fields(NodeConfig)}
    assert not (set(params) & (fields | set(node.KEYWORDS) | set(client.KEYWORDS))), set(params)
    assert params["config"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


def test_client_keywords_are_nodeconfigs_fields_typed_and_without_defaults_of_their_own():
    # help(peercache.connect) lists them: each a NodeConfig field (page_size is page_bytes), keyword-only,
    # typed as the field (Optional), None by default (NodeConfig's default applies): no second list of defaults
    params = inspect.signature(peercache.Client.__init__).parameters
    fields = {f.name: f.type for f in dataclasses.fields(NodeConfig)}
    spelled = {v: k for k, v in client.KEYWORDS.items()}     # field -> the client's keyword
    named = {n: p for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert {client.KEYWORDS.get(n, n) for n in named} == set(fields), set(named) ^ set(fields)
    for n, p in named.items():
        t = fields[client.KEYWORDS.get(n, n)]
        assert p.default is None, n
        assert p.annotation == (t if t.startswith("Optional[") else f"Optional[{t}]"), (n, p.annotation, t)
    assert params["config"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and params["config"].default is None
    assert set(inspect.signature(peercache.connect).parameters) == set(params) - {"self"}
    doc = peercache.connect.__doc__
    for n, o in NodeConfig.options().items():
        assert f"``{spelled.get(n, n)}``" in doc and o.doc in doc, n


def test_the_keyword_form_is_nodeconfig_with_the_old_spellings():
    of = NodeConfig.of
    assert of(None, {}, who="Node") == NodeConfig() and of("h:1", {}, who="Node") == NodeConfig(discovery_addr="h:1")
    c = NodeConfig(discovery_addr="10.0.0.1:4000", bind="0.0.0.0", page_bytes=4096, timeout=2.0, max_channels=3)
    assert of(None, {"discovery_addr": "10.0.0.1:4000", "bind_host": "0.0.0.0", "slot_capacity": 4096,
                     "rpc_timeout": 2.0, "max_channels": 3}, who="Node", spellings=node.KEYWORDS) == c
    assert of("10.0.0.1:4000", {"bind": "0.0.0.0", "page_size": 4096, "timeout": 2.0, "max_channels": 3},
              who="Client", spellings=client.KEYWORDS) == c
    # what node_kwargs gives Node reads back as the config it came from
    kw = c.node_kwargs(name="n")
    for k in NODE_OWN:
        kw.pop(k, None)
    assert of(None, kw, who="Node", spellings=node.KEYWORDS) == c
    # None keeps a field whose default is not None (Node's old dir_table_entries=None)
    assert of(None, {"dir_table_entries": None}, who="Node").dir_table_entries == NodeConfig().dir_table_entries


@pytest.mark.parametrize("make, match", [
    (lambda: Node("127.0.0.1:1", max_chanels=2), r"Node.__init__\(\) got an unexpected keyword argument 'max_chanels'"),
    (lambda: peercache.Client(pagesize=4096), r"Client.__init__\(\) got an unexpected keyword argument 'pagesize'"),
    (lambda: Node(bind="a", bind_host="b"), r"got 'bind' twice \(as 'bind_host' too\)"),
    (lambda: peercache.Client(4000), "takes a NodeConfig or a discovery address"),
], ids=["node-unknown", "client-unknown", "two-spellings", "not-an-address"])
def test_a_keyword_that_is_no_option_is_a_type_error_naming_it(make, match):
    with pytest.raises(TypeError, match=match):
        make()


def test_hicache_keys_are_the_declared_ones():
    keys = sorted(o.key for o in hicache.StoreConfig.options().values() if o.key)
    assert keys == EXTRA_KEYS
    with pytest.raises(ConfigError, match="'pol_bytes' is not a PeerCacheStore setting") as e:
        hicache.StoreConfig.from_extra({"pol_bytes": 1})
    assert str(EXTRA_KEYS) in str(e.value)


@pytest.mark.parametrize("key", EXTRA_KEYS)
def test_every_extra_key_refuses_a_bad_value_naming_itself(key):
    with pytest.raises(ConfigError, match=f"extra config '{key}'"):
        hicache.StoreConfig.from_extra({key: ["?"]})


FLAGGED = sorted(n for n, o in options.FLAGS.items() if o.check is not None)


@pytest.mark.parametrize("name", FLAGGED)
def test_every_flag_refuses_a_bad_value_naming_itself(name):
    o = options.FLAGS[name]
    with pytest.raises(ConfigError, match=o.flag.name):
        config.checked({name: o}, argparse.Namespace(**{o.dest: ["?"]}))


def test_a_flag_and_a_key_of_one_option_share_its_check():
    with pytest.raises(ConfigError, match="--max-channels must be positive, got 0"):
        options.validate(cli.build_parser().parse_args(["drive", "--max-channels", "0"]), "drive")
    with pytest.raises(ConfigError, match="extra config 'max_channels' must be positive, got 0"):
        hicache.StoreConfig.from_extra({"max_channels": 0})
    # extra config also takes sizes as text and lists as text; a flag takes what argparse made of it
    c = hicache.StoreConfig.from_extra({"page_bytes": "64K", "devices": "mlx5_0, mlx5_1", "protocol": "rdma",
                                        "gid_index": None})
    assert (c.page_bytes, c.devices, c.gid_index) == (64 << 10, ("mlx5_0", "mlx5_1"), None)


def test_hicache_defaults_differ_where_declared_and_a_store_builds_its_node_from_the_config():
    s, n = hicache.StoreConfig(), NodeConfig()
    assert (s.pool_bytes, s.dir_cache_ttl, s.tenant) == (hicache.DEFAULT_POOL_BYTES, hicache.DEFAULT_DIR_CACHE_TTL,
                                                         "default")
    assert (n.pool_bytes, n.dir_cache_ttl) == (0, 0.0)
    c = hicache.StoreConfig.from_extra({"protocol": "rdma", "devices": ["mlx5_0"], "gid_index": 3, "timeout": 2,
                                        "bind": "0.0.0.0", "pool_bytes": "1MiB", "max_channels": 2})
    kw = c.node_kwargs(page_bytes=4096, name="hicache-tp0")
    assert kw["transport_options"] == {"devices": ["mlx5_0"], "ib_port": 1, "gid_index": 3}
    assert (kw["rpc_timeout"], kw["bind_host"], kw["slot_capacity"], kw["max_channels"], kw["dir_cache_ttl"]) == \
        (2.0, "0.0.0.0", 4096, 2, 5.0)
    assert kw["pool_slots"] == (1 << 20) // tags.slot_stride(4096) and kw["name"] == "hicache-tp0"
    assert "auth_key=" not in repr(c)   # the secret is never shown


def test_serve_flags_make_the_node_serve_had():
    args = cli.build_parser().parse_args(["serve", "--protocol", "tcp", "--tcp-poll-us", "7", "--page-size", "4096",
                                          "--working-set", "8", "--heartbeat-timeout", "3", "--integrity"])
    options.validate(args, "serve")
    kw = dataclasses.replace(options.node_config(args), host_discovery=True,
                             pool_bytes=8 * options.slot_bytes(4096)).node_kwargs(name="serve")
    assert (kw["pool_slots"], kw["slot_capacity"], kw["max_channels"], kw["heartbeat_timeout"]) == (8, 4096, 8, 3.0)
    assert kw["transport_options"] == {"poll_us": 7} and kw["integrity"] and kw["dir_cache_ttl"] == 0.0


def test_meta_flags_are_the_declared_ones_with_help():
    text = cli.build_parser()._subparsers._group_actions[0].choices["meta"].format_help()
    for flag in ("--discovery-addr", "--heartbeat-timeout", "--directory", "--auth-key-file"):
        assert flag in text
    assert "drop nodes silent for this long [5.0]" in text


def test_drive_flags_make_the_node_a_drive_worker_had():
    # drive's workers build their node from the run's NodeConfig: a reader (no pool) with drive's timeouts
    args = cli.build_parser().parse_args(["drive", "--protocol", "tcp", "--max-channels", "3", "--dir-cache-ttl",
                                          "0.5", "--integrity", "--page-size", "4096"])
    options.validate(args, "drive")
    node = dataclasses.replace(options.node_config(args), directory=options.directory(args), timeout=3.0)
    kw = node.node_kwargs(name="drive-0", transport_options={"io_timeout": 2.0})
    assert (kw["pool_slots"], kw["max_channels"], kw["dir_cache_ttl"], kw["rpc_timeout"], kw["integrity"]) == \
        (0, 3, 0.5, 3.0, True)
    assert kw["transport_options"] == {"io_timeout": 2.0} and kw["directory"] == args.discovery_addr


def test_a_pool_may_be_given_in_slots():
    kw = NodeConfig(page_bytes=64).node_kwargs(pool_slots=10, name="dirbench")
    assert (kw["pool_slots"], kw["slot_capacity"]) == (10, 64)


def test_extra_config_reads_back_as_the_same_node_options():
    c = NodeConfig(protocol="rdma", devices=("mlx5_0", "mlx5_1"), ib_port=2, max_channels=2, timeout=3.0,
                   page_bytes=4096, dir_cache_ttl=0.5, integrity=True, directory="127.0.0.1:4000")
    assert NodeConfig.from_extra(c.extra_config()) == c
    assert "devices" not in dataclasses.replace(c, protocol="tcp").extra_config()   # rails are rdma's only


def test_every_engine_bound_is_declared_once_in_seconds_with_a_one_line_doc():
    from peercache.timeouts import DEFAULT, Timeouts
    docs = Timeouts.docs()
    assert set(docs) == {f.name for f in dataclasses.fields(Timeouts)} and len(docs) >= 8
    for name, (unit, doc) in docs.items():
        assert name.endswith("_s") and unit == "s", name
        assert doc and "\n" not in doc and len(doc) < 140, name
        v = getattr(DEFAULT, name)
        assert v is None or v > 0, (name, v)
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.directory_s = 1.0
    # the user's knob for a directory request and a whole read has the declared bound as its default
    assert NodeConfig().timeout == DEFAULT.directory_s and NodeConfig().timeouts == DEFAULT
    assert "timeouts" not in NodeConfig.options() and "timeouts" not in NodeConfig().extra_config()
    # io_s unset: a tcp call may wait as long as the whole read; set: its own bound
    assert (Timeouts().io(7.0), Timeouts(io_s=0.5).io(7.0)) == (7.0, 0.5)


def test_drive_derives_the_engine_bounds_it_does_not_change():
    from peercache.bench.drive import bounds
    from peercache.timeouts import DEFAULT
    assert (bounds.RDMA_CONNECT_S, bounds.RDMA_COMPLETION_S) == (DEFAULT.rdma_connect_s, DEFAULT.rdma_completion_s)


def test_max_channels_has_one_default_on_every_surface():
    # the library (Node, Client, HiCache's extra config) and every peercache-bench flag say the same
    o = NodeConfig.options()["max_channels"]
    assert o.flag.default is config.SAME and o.flag_default == o.default == NodeConfig().max_channels
    assert hicache.StoreConfig().max_channels == o.default
    for argv in (["serve"], ["drive"]):
        assert cli.build_parser().parse_args(argv).max_channels == o.default, argv
    text = cli.build_parser()._subparsers._group_actions[0].choices["drive"].format_help()
    assert f"data channels per peer [{o.default}]" in " ".join(text.split())
