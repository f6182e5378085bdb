"""ZeRO checkpoint to a Hugging Face directory (streamed), and text generation."""
