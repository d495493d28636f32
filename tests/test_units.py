import pytest

from vmem import format_bytes, parse_bytes


@pytest.mark.parametrize(
    "text, expected",
    [
        ("512MiB", 512 * 2**20),
        ("12GB", 12 * 10**9),
        ("1KB", 1000),
        ("3KiB", 3072),
        ("1.5GiB", 3 * 2**29),
        ("256 MiB", 256 * 2**20),
        ("100B", 100),
        (4096, 4096),
    ],
)
def test_parse_bytes_accepts_the_documented_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["12 gigs", "512mib", "1PB", "MiB", "", "1024", "-5MiB", "0GB", "1e3MB"])
def test_parse_bytes_rejects_anything_else_and_names_the_option(text):
    with pytest.raises(ValueError, match=r"memory="):
        parse_bytes(text)


@pytest.mark.parametrize("value", [0, -1, True, 1.5, None, [1]])
def test_parse_bytes_rejects_non_sizes(value):
    with pytest.raises(ValueError, match="capacity="):
        parse_bytes(value, name="capacity")


def test_format_bytes():
    assert format_bytes(3 * 2**20) == "3.00 MiB"
    assert format_bytes(100) == "100 B"
    assert format_bytes(5 * 2**30) == "5.00 GiB"


def test_spec_options_are_set_through_the_parser_not_by_editing_the_string():
    from vmem.spec import format_spec, parse_spec, with_options

    assert with_options("vdnn-all:algos=performance,sync=layer", sync="event") == (
        "vdnn-all:algos=performance,sync=event"
    )
    assert with_options("vdnn-all", sync="event") == "vdnn-all:sync=event"
    assert with_options("gist:dpr=fp8,lossless=true", lossless=False) == "gist:dpr=fp8,lossless=false"
    for spec in ("baseline", "vdnn-all:algos=memory,codec=zvc", "echo:depth=3"):
        assert format_spec(*parse_spec(spec)) == spec
