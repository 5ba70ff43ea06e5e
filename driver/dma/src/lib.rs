//! vfpoll dma layer (being written).
