//! Mirage DSM (fleisch89). Work in progress.
