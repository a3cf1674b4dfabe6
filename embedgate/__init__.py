"""embedgate: serve recommendation models whose embedding tables live in sharded, streaming-updated PS servables."""

__all__: list[str] = []
