//! Optional dense retrieval through an OpenAI-compatible `/embeddings` endpoint.
