# pdtok-tmpl-render: the chat-template driver the exactness test runs. Reads JSON lines
# {"template_dir": ..., "request": {...}} and prints one JSON line per input:
# {"ok": "<rendered text>"} or {"error": "<message>"}.
if(TARGET pdtok)
    add_executable(pdtok-tmpl-render ${CMAKE_CURRENT_SOURCE_DIR}/chat_render_driver.c)
    target_link_libraries(pdtok-tmpl-render PRIVATE pdtok)
    set_target_properties(pdtok-tmpl-render PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PDGW_BIN_DIR})
endif()
