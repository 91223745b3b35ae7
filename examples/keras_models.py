"""Keras models for the TensorFlow/Keras examples, defined here so they need no download:
`mlp46m` (46M parameters: communication heavy), `convnet` (a small ResNet-style CNN: compute heavy),
`mlp` (tiny, for smoke tests), or any keras.applications name (ResNet50, ...; random weights)."""
import keras


def build(name, image_size=224, classes=1000):
    shape = (image_size, image_size, 3)
    if name == "mlp":
        layers = [keras.layers.Flatten(), keras.layers.Dense(64, activation="relu")]
    elif name == "mlp46m":
        layers = [keras.layers.Flatten()] + [keras.layers.Dense(4096, activation="relu")
                                             for _ in range(3)]
    elif name == "convnet":
        layers = [keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")]
        for channels in (32, 64, 64, 128):
            layers += [keras.layers.Conv2D(channels, 3, padding="same", activation="relu"),
                       keras.layers.MaxPooling2D()]
        layers += [keras.layers.GlobalAveragePooling2D()]
    else:
        return getattr(keras.applications, name)(weights=None, input_shape=shape,
                                                 classes=classes)
    return keras.Sequential([keras.Input(shape), *layers, keras.layers.Dense(classes)])


def input_size(name, image_size):
    """mlp46m sees 32x32 images (its first layer has 3072 x 4096 weights)."""
    return 32 if name == "mlp46m" else image_size
