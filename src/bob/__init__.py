"""Bob: a bigram language model whose device program is declared as data, certified, and
run on the CPU or an NVIDIA GPU with bit-identical results.

    import bob
    model = bob.train(bob.TrainConfig(text="input.txt", steps=1000))
    print(model.generate("ROMEO:", 100))
    model = bob.load("bob.safetensors")

`import bob` loads nothing else: `train`, `load`, `Model` and `TrainConfig` come from
`bob.host.model` when first named, so the `bob` executable's start-up stays short.
"""

__all__ = ["Model", "TrainConfig", "load", "train"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from bob.host import model

        value = getattr(model, name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module 'bob' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
