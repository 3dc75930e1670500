"""What describes a model, apart from any run: where it comes from and its checksum
(`source.py`), its shape from config.json (`shape.py`), and a pre-quantized checkpoint's
quantization_config (`checkpoint.py`)."""
