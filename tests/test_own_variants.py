"""dev/bringup/own_variants.py keeps every own image of a tree for timing on a GPU later:
a saved build holds the images this tree builds, byte for byte."""

from __future__ import annotations

from bob.kernels import own
from bob.kernels import signatures as sig
from dev.bringup import own_variants


def test_a_saved_build_holds_every_own_image_of_the_tree(tmp_path):
    path = own_variants.save("here", tmp_path)
    assert path == tmp_path / "here.pickle"
    build = own_variants.load(path)
    assert build["label"] == "here" and build["commit"]
    assert set(build["images"]) == set(own.BUILDERS)
    for name, image in build["images"].items():
        built = own.image(name, own_variants.ARCH)
        assert (image.code, image.registers, image.shared_bytes) == \
            (built.code, built.registers, built.shared_bytes), name


def test_a_build_saved_in_the_latency_ordering_holds_that_ordering_s_images(tmp_path,
                                                                         monkeypatch):
    from bob.isa.builder import ordering

    # One region is enough to tell the orderings apart; every region takes a minute.
    monkeypatch.setattr(own, "BUILDERS", {sig.LOSS_HARD: own.BUILDERS[sig.LOSS_HARD]})
    build = own_variants.load(own_variants.save("reordered", tmp_path, "latency"))
    assert set(build["images"]) == {sig.LOSS_HARD}
    with ordering("latency"):
        reordered = own.image(sig.LOSS_HARD, own_variants.ARCH)
    assert build["images"][sig.LOSS_HARD].code == reordered.code
    assert reordered.code != own.image(sig.LOSS_HARD, own_variants.ARCH).code
