# test_nomalloc counts the allocations of dtrain's own code by wrapping the
# allocator at link time.
if(TARGET test_nomalloc)
  target_link_options(test_nomalloc PRIVATE
    -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc -Wl,--wrap=aligned_alloc)
endif()
