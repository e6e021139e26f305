"""What several components share and nothing else: Hugging Face loading, Ray placement and
addresses, config sections, the weight-sync wire format. Imports no component and no driver."""
