// Bastion: starts Swagger UI for the OpenAPI document named by the page (data-openapi-url), so the page needs
// no inline script under its Content-Security-Policy. validatorUrl: null keeps Swagger UI from loading the
// online validator's badge; persistAuthorization stays off, so a token typed into "Authorize" is not stored.
window.addEventListener("load", function () {
  var element = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: element.getAttribute("data-openapi-url"),
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
});
