from blogkit.slug import slugify


def test_simple():
    assert slugify("hello") == "hello"


def test_single_space():
    assert slugify("Hello World") == "hello-world"
