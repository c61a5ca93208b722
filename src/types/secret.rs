//! [`Secret`]: a credential whose `Debug` never shows it. Defined with the channel contract
//! (the platform crates' settings hold secrets too) and shared here.

pub use clawft_channel_core::secret::Secret;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_value() {
        assert_eq!(format!("{:?}", Secret::new("sk-123")), "Secret(***)");
    }
}
